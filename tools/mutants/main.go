// Command mutants is the mutation test (make mutants, docs/verification.md): it builds the model
// tests with the sluice_mutants tag, checks they pass with no bug planted, then plants each bug
// of the catalog (internal/mutant) in turn and expects the tests to fail. It prints one line per
// mutant:
//
//	MUTANT settle-no-fence       caught     12.3s  sorted-set settle without the lease-token fence
//
// caught means the tests failed and the planted code was reached; survived means they passed;
// unreached means they failed without the planted code ever running (a flaky or broken test,
// not a catch). It exits non-zero unless every mutant is caught.
package main

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/mutant"
)

func main() {
	only := flag.String("only", "", "run only the mutants whose names match this regular expression")
	list := flag.Bool("list", false, "list the catalog and exit")
	verbose := flag.Bool("v", false, "print the test output of every run")
	timeout := flag.Duration("timeout", 10*time.Minute, "time limit for one test run")
	flag.Parse()
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	if err := run(ctx, *only, *list, *verbose, *timeout); err != nil {
		fmt.Fprintln(os.Stderr, "mutants:", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, only string, list, verbose bool, timeout time.Duration) error {
	cat := mutant.Catalog()
	if only != "" {
		re, err := regexp.Compile(only)
		if err != nil {
			return fmt.Errorf("-only: %w", err)
		}
		var kept []mutant.Mutant
		for _, m := range cat {
			if re.MatchString(string(m.Name)) {
				kept = append(kept, m)
			}
		}
		cat = kept
	}
	if len(cat) == 0 {
		return errors.New("no mutant selected")
	}
	if list {
		for _, m := range cat {
			fmt.Printf("%-24s %s (%s -run %q)\n", m.Name, m.Doc, strings.Join(m.Packages, " "), m.Run)
		}
		return nil
	}
	work, err := os.MkdirTemp("", "sluice-mutants-")
	if err != nil {
		return fmt.Errorf("work dir: %w", err)
	}
	defer os.RemoveAll(work)

	// One test binary per package, built once with the tag.
	bins := map[string]testBin{}
	for _, m := range cat {
		for _, pkg := range m.Packages {
			if _, ok := bins[pkg]; ok {
				continue
			}
			b, err := build(ctx, work, pkg, len(bins))
			if err != nil {
				return err
			}
			bins[pkg] = b
		}
	}

	// Baseline: every selected run passes with no bug planted, or a failure proves nothing.
	type runKey struct{ pkg, run, args string }
	baselined := map[runKey]bool{}
	for _, m := range cat {
		for _, pkg := range m.Packages {
			k := runKey{pkg, m.Run, strings.Join(m.Args, " ")}
			if baselined[k] {
				continue
			}
			baselined[k] = true
			start := time.Now()
			out, err := bins[pkg].run(ctx, m, "", "", timeout)
			if verbose {
				os.Stdout.Write(out)
			}
			if err != nil {
				os.Stdout.Write(out)
				return fmt.Errorf("baseline %s -run %q fails with no mutant planted: %w", pkg, m.Run, err)
			}
			fmt.Printf("BASELINE %-24s passed %6.1fs\n", pkg, time.Since(start).Seconds())
		}
	}

	notCaught := 0
	for _, m := range cat {
		hits := filepath.Join(work, "hits-"+string(m.Name))
		if err := os.Mkdir(hits, 0o755); err != nil {
			return fmt.Errorf("hits dir: %w", err)
		}
		start := time.Now()
		failed := false
		var outs []byte
		for _, pkg := range m.Packages {
			out, err := bins[pkg].run(ctx, m, string(m.Name), hits, timeout)
			outs = append(outs, out...)
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if err != nil {
				failed = true
			}
		}
		_, statErr := os.Stat(filepath.Join(hits, string(m.Name)))
		reached := statErr == nil
		verdict := "caught"
		switch {
		case !failed:
			verdict = "survived"
		case !reached:
			verdict = "unreached"
		}
		if verdict != "caught" {
			notCaught++
		}
		if verbose || verdict != "caught" {
			os.Stdout.Write(outs)
		}
		fmt.Printf("MUTANT %-24s %-9s %6.1fs  %s", m.Name, verdict, time.Since(start).Seconds(), m.Doc)
		if verdict == "caught" {
			if first := firstFailure(outs); first != "" {
				fmt.Printf("  [%s]", first)
			}
		}
		fmt.Println()
	}
	if notCaught > 0 {
		return fmt.Errorf("%d of %d mutants not caught", notCaught, len(cat))
	}
	fmt.Printf("all %d mutants caught\n", len(cat))
	return nil
}

// testBin is one package's test binary built with the sluice_mutants tag.
type testBin struct {
	path, dir string
}

func build(ctx context.Context, work, pkg string, n int) (testBin, error) {
	dir, err := exec.CommandContext(ctx, "go", "list", "-tags", mutant.Tag, "-f", "{{.Dir}}", pkg).Output()
	if err != nil {
		return testBin{}, fmt.Errorf("go list %s: %w", pkg, err)
	}
	bin := filepath.Join(work, fmt.Sprintf("pkg%d.test", n))
	cmd := exec.CommandContext(ctx, "go", "test", "-c", "-tags", mutant.Tag, "-o", bin, pkg)
	cmd.Stderr = os.Stderr
	cmd.Stdout = os.Stdout
	if err := cmd.Run(); err != nil {
		return testBin{}, fmt.Errorf("build tests of %s with -tags %s: %w", pkg, mutant.Tag, err)
	}
	return testBin{path: bin, dir: strings.TrimSpace(string(dir))}, nil
}

// run runs the binary's selected tests with the named mutant planted ("" plants none).
func (b testBin) run(ctx context.Context, m mutant.Mutant, name, hits string, timeout time.Duration) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	args := []string{"-test.count=1", "-test.timeout=" + timeout.String()}
	if m.Run != "" {
		args = append(args, "-test.run="+m.Run)
	}
	args = append(args, m.Args...)
	cmd := exec.CommandContext(ctx, b.path, args...)
	cmd.Dir = b.dir
	env := []string{}
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, mutant.EnvVar+"=") && !strings.HasPrefix(kv, mutant.HitsEnvVar+"=") {
			env = append(env, kv)
		}
	}
	if name != "" {
		env = append(env, mutant.EnvVar+"="+name, mutant.HitsEnvVar+"="+hits)
	}
	cmd.Env = env
	var out bytes.Buffer
	cmd.Stdout = &out
	cmd.Stderr = &out
	err := cmd.Run()
	return out.Bytes(), err
}

var failLine = regexp.MustCompile(`(?m)^\s*--- FAIL: (\S+)`)

// firstFailure names a failing test of a run (the last "--- FAIL" line of its output).
func firstFailure(out []byte) string {
	var last string
	for _, m := range failLine.FindAllSubmatch(out, -1) {
		last = string(m[1])
	}
	return last
}
