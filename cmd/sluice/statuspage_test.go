package main

import (
	"testing"

	"github.com/spf13/pflag"
)

// The status page is on unless the config file's status_page or
// --status-page turns it off; the flag wins over the file.
func TestStatusPageSetting(t *testing.T) {
	off := writeFile(t, "off.json", `{"status_page": false}`)
	on := writeFile(t, "on.json", `{"status_page": true}`)
	for _, tt := range []struct {
		args []string
		want bool
	}{
		{nil, true},
		{[]string{"--status-page=false"}, false},
		{[]string{"--config", off}, false},
		{[]string{"--config", on}, true},
		{[]string{"--config", off, "--status-page"}, true},
		{[]string{"--config", on, "--status-page=false"}, false},
	} {
		f := &serveFlags{}
		fs := pflag.NewFlagSet("serve", pflag.ContinueOnError)
		f.register(fs)
		if err := fs.Parse(tt.args); err != nil {
			t.Fatal(err)
		}
		cfg, err := f.load(fs)
		if err != nil {
			t.Fatalf("%v: %v", tt.args, err)
		}
		if got := cfg.StatusPageEnabled(); got != tt.want {
			t.Errorf("%v: status page %v, want %v", tt.args, got, tt.want)
		}
	}
}
