package main

import (
	"os"
	"path/filepath"
	"regexp"
	"slices"
	"strings"
	"testing"
)

// readmeTableNames returns the first cell's backquoted name of every body
// row (past the header) of the first table under README's "## heading"
// section.
func readmeTableNames(t *testing.T, readme, heading string) []string {
	t.Helper()
	_, sec, ok := strings.Cut(readme, "\n## "+heading+"\n")
	if !ok {
		t.Fatalf("README has no section %q", heading)
	}
	sec, _, _ = strings.Cut(sec, "\n## ")
	first := regexp.MustCompile("^\\| `([^`]+)`")
	var names []string
	inTable, body := false, false
	for line := range strings.Lines(sec) {
		if !strings.HasPrefix(line, "|") {
			if inTable {
				break
			}
			continue
		}
		inTable = true
		if strings.HasPrefix(line, "|---") || strings.HasPrefix(line, "| ---") {
			body = true
			continue
		}
		if !body {
			continue
		}
		if m := first.FindStringSubmatch(line); m != nil {
			names = append(names, m[1])
		}
	}
	slices.Sort(names)
	return names
}

// README's gate and transport tables list exactly the gate types and
// transports adapters() registers: adding or removing one without the
// README fails here.
func TestReadmeTablesMatchRegistries(t *testing.T) {
	b, err := os.ReadFile(filepath.Join("..", "..", "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	ad, err := adapters()
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		heading    string
		registered []string
	}{
		{"Gates", ad.Gates.Names()},
		{"Transports", ad.Transports.Names()},
	} {
		want := slices.Sorted(slices.Values(c.registered))
		got := readmeTableNames(t, string(b), c.heading)
		for _, n := range want {
			if !slices.Contains(got, n) {
				t.Errorf("README's %s table lacks the registered %q", c.heading, n)
			}
		}
		for _, n := range got {
			if !slices.Contains(want, n) {
				t.Errorf("README's %s table lists %q, which adapters() does not register", c.heading, n)
			}
		}
		if len(got) != len(slices.Compact(slices.Clone(got))) {
			t.Errorf("README's %s table lists a name twice: %v", c.heading, got)
		}
	}
}
