package main

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/gates/gatecheck"
	"github.com/sluice-io/sluice/plugins/host"
)

// pluginFlags are the flags shared by the plugin subcommands.
type pluginFlags struct {
	params  string
	args    string
	timeout time.Duration
}

func (f *pluginFlags) register(cmd *cobra.Command) {
	fs := cmd.Flags()
	fs.StringVar(&f.params, "params", "", `gate_params as a JSON object, as a queue's config gives them (without "path"), e.g. '{"file":"/tmp/budget"}'`)
	fs.StringVar(&f.args, "args", "", `the plugin's arguments: a JSON array, or words separated by spaces (gate_params.args)`)
}

// config reads the flags into the host's config for the plugin at path,
// through the same parameter parsing as a queue's gate_params. admit is
// dropped: the commands find out whether the plugin implements Admit.
func (f *pluginFlags) config(path string) (host.Config, error) {
	raw := map[string]json.RawMessage{}
	if strings.TrimSpace(f.params) != "" {
		if err := json.Unmarshal([]byte(f.params), &raw); err != nil {
			return host.Config{}, fmt.Errorf("--params: want a JSON object: %w", err)
		}
	}
	if _, ok := raw[host.ParamPath]; ok {
		return host.Config{}, fmt.Errorf("--params: %q is the command's argument, not a parameter", host.ParamPath)
	}
	delete(raw, host.ParamAdmit)
	raw[host.ParamPath], _ = json.Marshal(path)
	if f.args != "" {
		raw[host.ParamArgs], _ = json.Marshal(f.args)
	}
	p, err := gate.ParseParams(raw)
	if err != nil {
		return host.Config{}, fmt.Errorf("--params: %w", err)
	}
	return host.ConfigFromParams(p)
}

// newPlugin returns `sluice plugin` and its subcommands.
func newPlugin() *cobra.Command {
	cmd := &cobra.Command{
		Use:   "plugin",
		Short: "Check a gate plugin binary: describe it, or run the gate conformance suite against it",
		Long: `Tools for authors of gate plugins (docs/plugins.md). Both commands start the
binary the way a queue with gate_type "plugin" does (same handshake, arguments
and Configure call with the given gate_params) and stop it when done.`,
		Args: cobra.NoArgs,
	}
	cmd.AddCommand(newPluginDescribe(), newPluginTest())
	return cmd
}

func newPluginDescribe() *cobra.Command {
	f := &pluginFlags{}
	cmd := &cobra.Command{
		Use:   "describe PATH",
		Short: "Start a gate plugin, print what it is and implements, and stop it",
		Long: `Start the gate plugin at PATH with --params, and print the protocol version
agreed in the handshake, what it implements (Budget, and Admit or not), its own
description and how long it took to start; then stop it. A plugin that fails
to start or refuses its parameters is an error (exit status 1).`,
		Example: `  sluice plugin describe bin/gate-plugin --params '{"file":"/tmp/sluice-budget"}'
  sluice plugin describe examples/gate-plugin-python/gate_plugin.py --params '{"budget":"0.5"}'`,
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.config(args[0])
			if err != nil {
				return err
			}
			info, err := host.Probe(cmd.Context(), cfg)
			if err != nil {
				return err
			}
			printInfo(cmd.OutOrStdout(), info)
			return nil
		},
	}
	f.register(cmd)
	return cmd
}

func printInfo(w io.Writer, info host.Probed) {
	impl := "Budget, Admit"
	if !info.Admitter {
		impl = "Budget (no Admit: gate_params.admit must stay false)"
	}
	desc := info.Description
	if desc == "" {
		desc = "(none)"
	}
	fmt.Fprintf(w, "plugin       %s\n", info.Path)
	fmt.Fprintf(w, "protocol     %d\n", info.Protocol)
	if info.SDK != "" {
		fmt.Fprintf(w, "sdk          %s\n", info.SDK)
	}
	fmt.Fprintf(w, "mutual TLS   %v\n", info.TLS)
	fmt.Fprintf(w, "implements   %s\n", impl)
	fmt.Fprintf(w, "description  %s\n", desc)
	fmt.Fprintf(w, "started in   %v (pid %d)\n", info.Startup.Round(time.Millisecond), info.PID)
}

func newPluginTest() *cobra.Command {
	f := &pluginFlags{}
	cmd := &cobra.Command{
		Use:   "test PATH",
		Short: "Run the gate conformance suite against a gate plugin binary",
		Long: `Run the gate conformance suite (gates/gatetest, the one every built-in gate
passes) against the gate plugin at PATH, started with --params, and print one
line per property: PASS or FAIL, how long it took, and what went wrong.

Before the suite, four properties of a plugin binary:
  Starts                the plugin starts, accepts --params and answers Describe
  RefusesUnknownParams  a parameter it does not know is refused, naming it
  Answers               Budget (and Admit, when implemented) answer 50 times each
                        within 1s, without an error or a fallback, a budget in
                        [0,1] and a valid decision (latency p50/p99 shown)
  Restarts              killed with SIGKILL, it is started again (restart_backoff
                        50ms for this property)

The suite then runs against gates as a queue builds them: with admit on when
the plugin implements Admit (which adds the Releases property), else off. The
exit status is 1 when any property fails.`,
		Example: `  sluice plugin test bin/gate-plugin --params '{"file":"/tmp/sluice-budget"}'`,
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			cfg, err := f.config(args[0])
			if err != nil {
				return err
			}
			if !runPluginSuite(cmd.Context(), cmd.OutOrStdout(), cfg, f.timeout) {
				return exitError{1}
			}
			return nil
		},
	}
	f.register(cmd)
	cmd.Flags().DurationVar(&f.timeout, "timeout", time.Minute, "bound on each property; one still running then fails")
	return cmd
}

// runPluginSuite runs every property against the plugin cfg names, printing
// the report to w; it reports whether all passed.
func runPluginSuite(ctx context.Context, w io.Writer, cfg host.Config, timeout time.Duration) bool {
	begin := time.Now()
	fmt.Fprintf(w, "plugin %s\n", cfg.Path)
	var info host.Probed
	var results []propResult
	report := func(r propResult) {
		results = append(results, r)
		r.print(w)
	}
	report(runProp("Starts", timeout, func(t *propT) {
		c, cancel := context.WithTimeout(ctx, cfg.StartTimeout+5*time.Second)
		defer cancel()
		var err error
		if info, err = host.Probe(c, cfg); err != nil {
			t.Fatalf("%v", err)
		}
		admit := "without Admit"
		if info.Admitter {
			admit = "with Admit"
		}
		t.detail = fmt.Sprintf("protocol %d, %s, started in %v", info.Protocol, admit, info.Startup.Round(time.Millisecond))
		if info.Description != "" {
			t.detail += fmt.Sprintf(", %q", info.Description)
		}
	}))
	if results[0].failed() {
		fmt.Fprintf(w, "FAILED  the plugin did not start; the other properties need one and were not run (%v)\n", time.Since(begin).Round(time.Millisecond))
		return false
	}
	cfg.Admit = info.Admitter
	for _, p := range pluginProps(cfg) {
		report(runProp(p.Name, timeout, func(t *propT) { p.Check(t) }))
	}
	newGate := func(t gatecheck.T) gate.Gate { return newPluginGate(t, cfg) }
	for _, p := range gatecheck.Properties(newGate, gatecheck.Features{}, cfg.Admit) {
		report(runProp(p.Name, timeout, func(t *propT) { p.Check(t) }))
	}
	failed := 0
	for _, r := range results {
		if r.failed() {
			failed++
		}
	}
	el := time.Since(begin).Round(time.Millisecond)
	if failed > 0 {
		fmt.Fprintf(w, "FAILED  %d of %d properties failed (%v)\n", failed, len(results), el)
		return false
	}
	fmt.Fprintf(w, "ok      %d properties passed (%v)\n", len(results), el)
	return true
}

// newPluginGate builds the gate a queue would (an AdmitGate when cfg.Admit),
// starts its plugin, and closes it when t ends. Starting first makes the
// properties' bounds (a second or a few) apply to answers, not to the
// plugin's start-up, which an interpreted plugin on a busy machine can spend
// seconds on (start_timeout bounds it).
func newPluginGate(t gatecheck.T, cfg host.Config) gate.Gate {
	t.Helper()
	g, err := host.New(cfg)
	if err != nil {
		t.Fatalf("%v", err)
	}
	t.Cleanup(func() { _ = g.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), cfg.StartTimeout+5*time.Second)
	defer cancel()
	if err := g.Start(ctx); err != nil {
		t.Fatalf("start: %v", err)
	}
	if cfg.Admit {
		return &host.AdmitGate{Gate: g}
	}
	return g
}

// unknownParam is the parameter RefusesUnknownParams adds.
const unknownParam = "sluice_plugin_test_unknown"

// pluginProps are the properties of a plugin binary that the gate suite
// does not check (it accepts an error as an answer, and knows nothing of
// processes). The T they get is always a *propT.
func pluginProps(cfg host.Config) []gatecheck.Property {
	return []gatecheck.Property{
		{Name: "RefusesUnknownParams", Check: func(t gatecheck.T) {
			c := cfg
			c.Params = map[string]string{unknownParam: "1"}
			for k, v := range cfg.Params {
				c.Params[k] = v
			}
			g, err := host.New(c)
			if err != nil {
				t.Fatalf("%v", err)
			}
			defer g.Close()
			ctx, cancel := context.WithTimeout(context.Background(), c.StartTimeout+5*time.Second)
			defer cancel()
			err = g.Start(ctx)
			switch {
			case err == nil:
				t.Errorf("the plugin accepted gate_params.%s; Configure must refuse a parameter it does not know", unknownParam)
			case !errors.Is(err, host.ErrRefused):
				t.Errorf("the plugin did not start: %v", err)
			case !strings.Contains(err.Error(), unknownParam):
				t.Errorf("refused, but the error does not name the parameter: %v", err)
			}
		}},
		{Name: "Answers", Check: func(t gatecheck.T) {
			pt := t.(*propT)
			g := newPluginGate(t, cfg)
			const calls = 50
			var lat []time.Duration
			for i := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				start := time.Now()
				b, err := g.Budget(ctx)
				el := time.Since(start)
				cancel()
				var fb *gate.FallbackError
				switch {
				case errors.As(err, &fb):
					err = fmt.Errorf("a fallback budget %v: %w", fb.Budget, fb.Err)
				case err == nil && gatecheck.CheckAnswer(b, nil) != nil:
					err = fmt.Errorf("%v, outside [0,1]", b)
				}
				if err != nil {
					t.Errorf("Budget call %d of %d: %v", i+1, calls, err)
					break
				}
				lat = append(lat, el)
			}
			pt.detail = "Budget " + latencies(lat)
			a, ok := g.(gate.Admitter)
			if !ok {
				return
			}
			lat = lat[:0]
			for i := range calls {
				ctx, cancel := context.WithTimeout(context.Background(), time.Second)
				req := &wire.Request{ID: fmt.Sprintf("sluice-plugin-test-%d", i), Deadline: time.Now().Add(time.Minute),
					Metadata: map[string]string{"tenant": "sluice-plugin-test"}}
				start := time.Now()
				d, err := a.Admit(ctx, req)
				el := time.Since(start)
				cancel()
				if d.Release != nil {
					d.Release()
				}
				if err == nil {
					err = gatecheck.CheckDecision(d)
				}
				if err != nil {
					t.Errorf("Admit call %d of %d: %v", i+1, calls, err)
					break
				}
				lat = append(lat, el)
			}
			pt.detail += ", Admit " + latencies(lat)
		}},
		{Name: "Restarts", Check: func(t gatecheck.T) {
			pt := t.(*propT)
			c := cfg
			c.RestartBackoff, c.RestartBackoffMax = 50*time.Millisecond, 50*time.Millisecond
			hg := unwrapHost(newPluginGate(t, c))
			ctx, cancel := context.WithTimeout(context.Background(), c.StartTimeout+5*time.Second)
			defer cancel()
			pid := hg.PID()
			if err := syscall.Kill(pid, syscall.SIGKILL); err != nil {
				t.Fatalf("kill %d: %v", pid, err)
			}
			killed := time.Now()
			var last error
			for ctx.Err() == nil {
				q, qcancel := context.WithTimeout(ctx, time.Second)
				err := hg.Start(q)
				qcancel()
				if np := hg.PID(); err == nil && np != pid && np > 0 {
					pt.detail = fmt.Sprintf("running again %v after SIGKILL", time.Since(killed).Round(time.Millisecond))
					return
				}
				last = err
				time.Sleep(10 * time.Millisecond)
			}
			t.Errorf("not running %v after SIGKILL (last error: %v)", time.Since(killed).Round(time.Millisecond), last)
		}},
	}
}

func unwrapHost(g gate.Gate) *host.Gate {
	if a, ok := g.(*host.AdmitGate); ok {
		return a.Gate
	}
	return g.(*host.Gate)
}

// latencies summarises call latencies: "p50 310µs p99 1.2ms (50 calls)".
func latencies(lat []time.Duration) string {
	if len(lat) == 0 {
		return "no good answer"
	}
	s := slices.Clone(lat)
	slices.Sort(s)
	q := func(p float64) time.Duration { return s[min(len(s)-1, int(p*float64(len(s))))] }
	r := func(d time.Duration) time.Duration { return d.Round(10 * time.Microsecond) }
	return fmt.Sprintf("p50 %v p99 %v (%d calls)", r(q(0.5)), r(q(0.99)), len(s))
}

// propT is the gatecheck.T of one property run by the CLI: it collects
// failures, runs cleanups when the property ends, and stops the property's
// goroutine on Fatalf.
type propT struct {
	name   string
	detail string // a line of facts shown after the result (set by the property's goroutine)

	mu       sync.Mutex
	errs     []string
	cleanups []func()
	ended    bool // cleanups have run; later ones run at once, later errors are dropped
}

var _ gatecheck.T = (*propT)(nil)

// Helper does nothing: the report has no file positions.
func (t *propT) Helper() {}

// Name is the property's name.
func (t *propT) Name() string { return t.name }

// Errorf records a failure; it is safe from any goroutine.
func (t *propT) Errorf(format string, args ...any) {
	t.mu.Lock()
	defer t.mu.Unlock()
	if !t.ended {
		t.errs = append(t.errs, fmt.Sprintf(format, args...))
	}
}

// Fatalf records a failure and ends the calling goroutine, which must be
// the property's.
func (t *propT) Fatalf(format string, args ...any) {
	t.Errorf(format, args...)
	runtime.Goexit()
}

// Cleanup registers f to run when the property ends.
func (t *propT) Cleanup(f func()) {
	t.mu.Lock()
	if !t.ended {
		t.cleanups = append(t.cleanups, f)
		t.mu.Unlock()
		return
	}
	t.mu.Unlock()
	f()
}

// end runs the cleanups, last registered first.
func (t *propT) end() {
	t.mu.Lock()
	fs := t.cleanups
	t.cleanups, t.ended = nil, true
	t.mu.Unlock()
	for i := len(fs) - 1; i >= 0; i-- {
		func() {
			defer func() { _ = recover() }()
			fs[i]()
		}()
	}
}

// propResult is one line of the report.
type propResult struct {
	name   string
	took   time.Duration
	detail string
	errs   []string
}

func (r propResult) failed() bool { return len(r.errs) > 0 }

func (r propResult) print(w io.Writer) {
	status := "PASS"
	if r.failed() {
		status = "FAIL"
	}
	line := fmt.Sprintf("%s  %-22s %8v", status, r.name, r.took.Round(time.Millisecond))
	if r.detail != "" {
		line += "  " + r.detail
	}
	fmt.Fprintln(w, line)
	for _, e := range r.errs {
		fmt.Fprintf(w, "        %s\n", strings.ReplaceAll(e, "\n", "\n        "))
	}
}

// runProp runs check in its own goroutine, as go test runs a test, bounded
// by timeout: a property still running then fails, and its cleanups run
// (closing its gates, which ends the calls it waits for).
func runProp(name string, timeout time.Duration, check func(t *propT)) propResult {
	t := &propT{name: name}
	done := make(chan struct{})
	start := time.Now()
	go func() {
		defer close(done)
		defer func() {
			if r := recover(); r != nil {
				t.Errorf("panic: %v", r)
			}
		}()
		check(t)
	}()
	timer := time.NewTimer(timeout)
	defer timer.Stop()
	finished := true
	select {
	case <-done:
	case <-timer.C:
		finished = false
		t.Errorf("did not finish within %v", timeout)
	}
	took := time.Since(start)
	t.mu.Lock()
	errs := slices.Clone(t.errs)
	t.mu.Unlock()
	t.end()
	res := propResult{name: name, took: took, errs: errs}
	if finished {
		res.detail = t.detail
	} else {
		select {
		case <-done:
		case <-time.After(5 * time.Second):
		}
	}
	return res
}
