// Command testplugin is a gate plugin for plugins/host's tests. Its first
// argument picks the behaviour:
//
//   - "" (none): budget 1, every request admitted;
//   - "hang": Budget and Admit block until their context ends;
//   - "hang-admit": budget 1, Admit blocks until its context ends;
//   - "exit": Budget ends the process;
//   - "env": Describe lists the environment variables REDIS_URL, PASSED,
//     SET and PLUGIN_CLIENT_CERT (present or not), to check what sluice
//     lets through;
//   - "wait": Admit answers Wait (delay 50ms) and labels the request
//     classification=overflow, removing its "drop" label;
//   - "flood": every Budget writes 100 lines to stderr;
//   - "panic": Budget panics (the runtime writes the trace to fd 2).
package main

import (
	"context"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/sluice-io/sluice/plugins/sdk"
)

type testGate struct{ mode string }

func (g testGate) Budget(ctx context.Context) (float64, error) {
	switch g.mode {
	case "hang":
		<-ctx.Done()
		return 0, ctx.Err()
	case "exit":
		os.Exit(3)
	case "panic":
		panic("planted panic")
	case "flood":
		for i := range 100 {
			fmt.Fprintf(os.Stderr, `{"@level":"warn","@message":"flood line %d"}`+"\n", i)
		}
	}
	return 1, nil
}

func (g testGate) Admit(ctx context.Context, req *sdk.Request) (sdk.Decision, error) {
	switch g.mode {
	case "hang", "hang-admit":
		<-ctx.Done()
		return sdk.Decision{}, ctx.Err()
	case "wait":
		req.SetLabel("classification", "overflow")
		req.SetLabel("drop", "")
		return sdk.Decision{Verdict: sdk.Wait, Delay: 50 * time.Millisecond, Reason: "pool full"}, nil
	}
	return sdk.Admitted, nil
}

func (g testGate) Describe() string {
	if g.mode != "env" {
		return "test plugin " + g.mode
	}
	var out []string
	for _, name := range []string{"REDIS_URL", "PASSED", "SET", "PLUGIN_CLIENT_CERT"} {
		v, ok := os.LookupEnv(name)
		switch {
		case !ok:
			out = append(out, name+" unset")
		case name == "PLUGIN_CLIENT_CERT":
			out = append(out, name+" set")
		default:
			out = append(out, name+"="+v)
		}
	}
	return strings.Join(out, "; ")
}

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	sdk.Serve(testGate{mode: mode})
}
