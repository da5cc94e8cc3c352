// Command chaos runs sluice under every fault the harness can cause here
// and counts, from the result destination, what came back: `make chaos`
// runs them all; `go run ./tools/chaos -only kill9-redis-sortedset`
// runs some; `-list` lists them.
//
// Each fault prints one line
//
//	CHAOS <name> requests=N answered=N lost=N duplicated=N seconds=S [key=value ...] linearizable=true|false result=ok|FAIL
//
// and the command exits non-zero when any fault lost a request, repeated
// a result where its transport promises none, returned a result code the
// request does not allow, or broke a rule of its own (printed on stderr).
// Every run starts with the self-check (-selfcheck runs it alone), which
// passes only when the harness counts the faults it planted itself,
// exactly. What each fault does and checks: docs/chaos.md.
//
// The sluice binary is built once (go build ./cmd/sluice); the servers
// (redis-server, the Pub/Sub emulator, prometheus) are started by the
// internal/testenv helpers on free loopback ports and stopped by PID; sluice
// runs as child processes with config files, against a recording gateway in
// this process.
package main

import (
	"context"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluice-io/sluice/tools/internal/names"
)

// fault is one chaos case.
type fault struct {
	name string
	run  func(ctx context.Context, e *env) *verdict
	// optIn: run only when named in -only (a control experiment, not a
	// check of sluice).
	optIn bool
}

// env is what every fault gets: the built binaries and a scratch dir.
type env struct {
	bin    string // sluice
	plugin string // examples/gate-plugin
	root   string
}

// faults lists every fault, in the order `make chaos` runs them. Add one
// by adding a line here.
func faults() []fault {
	// First the self-check: the harness plants a loss, a duplicate, a wrong
	// code and an unknown result and must count exactly those.
	all := []fault{{name: "selfcheck", run: runSelfcheck}}
	for _, tc := range transportCases() {
		all = append(all, fault{name: "kill9-" + tc.name, run: kill9Fault(tc)})
	}
	all = append(all, fault{name: "kill9-gcp-pubsub-bare", run: runKill9PubSubBare, optIn: true})
	for _, tc := range transportCases() {
		if tc.redis {
			all = append(all, fault{name: "redis-restart-aof-" + tc.name, run: redisRestartAOF(tc)})
		}
	}
	for _, tc := range transportCases() {
		if tc.redis {
			all = append(all, fault{name: "redis-outage-" + tc.name, run: redisOutage(tc)})
		}
	}
	all = append(all,
		fault{name: "redis-cluster-master-kill", run: runClusterMasterKill},
		fault{name: "pubsub-emulator-restart", run: runEmulatorRestart},
		fault{name: "gateway-faults", run: runGatewayFaults},
	)
	for _, tc := range transportCases() {
		if !tc.noFuzz {
			all = append(all, fault{name: "fuzz-" + tc.name, run: fuzzFault(tc)})
		}
	}
	all = append(all,
		fault{name: "plugin-kill", run: runPluginKill},
		fault{name: "prometheus-gone", run: runPrometheusGone},
	)
	for _, tc := range transportCases() {
		if tc.redis {
			all = append(all, fault{name: "sigterm-burst-" + tc.name, run: sigtermFault(tc)})
		}
	}
	return all
}

func main() {
	if bareMain() {
		return
	}
	only := flag.String("only", "", "comma-separated faults to run (default all)")
	list := flag.Bool("list", false, "list the faults and exit")
	selfcheck := flag.Bool("selfcheck", false, "run only the self-check (which every full run starts with): the harness plants a loss, a duplicate, a wrong code and an unknown result; exit status 0 only when it counted exactly those")
	keep := flag.Bool("keep", false, "keep the scratch dir (replica logs, configs) and print where it is")
	timeout := flag.Duration("timeout", 15*time.Minute, "give up after this long")
	flag.Parse()
	redis.SetLogger(quietLogger{}) // the harness's own clients retry while a server is away, on purpose

	all := faults()
	if *selfcheck {
		all, *only = []fault{{name: "selfcheck", run: runSelfcheck}}, ""
	}
	if *list {
		for _, f := range all {
			if f.optIn {
				fmt.Println(f.name, "(only with -only)")
			} else {
				fmt.Println(f.name)
			}
		}
		return
	}
	want := names.Set(*only)
	known := make([]string, len(all))
	for i, f := range all {
		known[i] = f.name
	}
	if u := names.Unknown(want, known); len(u) > 0 {
		fmt.Fprintf(os.Stderr, "chaos: unknown fault %q (use -list)\n", u[0])
		os.Exit(2)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	ctx, cancel := context.WithTimeout(ctx, *timeout)
	defer cancel()

	root, err := os.MkdirTemp("", "sluice-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, "chaos:", err)
		os.Exit(1)
	}
	if *keep {
		fmt.Fprintln(os.Stderr, "chaos: scratch dir", root)
	} else {
		defer os.RemoveAll(root)
	}
	e := &env{root: root, bin: filepath.Join(root, "sluice"), plugin: filepath.Join(root, "gate-plugin")}
	start := time.Now()
	gomod, err := exec.Command("go", "env", "GOMOD").Output()
	if err != nil || len(strings.TrimSpace(string(gomod))) == 0 {
		fmt.Fprintln(os.Stderr, "chaos: run inside the sluice module (go env GOMOD is empty)")
		os.Exit(1)
	}
	// The example plugin is a module of its own (it requires only the SDK
	// module): it is built from its folder.
	repo := filepath.Dir(strings.TrimSpace(string(gomod)))
	for _, b := range []struct{ out, dir string }{{e.bin, "."}, {e.plugin, "examples/gate-plugin"}} {
		pkg := "."
		if b.dir == "." {
			pkg = "./cmd/sluice"
		}
		cmd := exec.CommandContext(ctx, "go", "build", "-o", b.out, pkg)
		cmd.Dir = filepath.Join(repo, b.dir)
		if out, err := cmd.CombinedOutput(); err != nil {
			fmt.Fprintf(os.Stderr, "chaos: go build %s in %s: %v\n%s", pkg, b.dir, err, out)
			os.Exit(1)
		}
	}
	fmt.Fprintf(os.Stderr, "chaos: built sluice and the gate plugin in %s\n", time.Since(start).Round(time.Millisecond))

	failed := 0
	for _, f := range all {
		if (len(want) > 0 || f.optIn) && !want[f.name] {
			continue
		}
		if ctx.Err() != nil {
			fmt.Printf("CHAOS %s error=%q result=FAIL\n", f.name, "not run: "+ctx.Err().Error())
			failed++
			continue
		}
		t0 := time.Now()
		v := f.run(ctx, e)
		v.name = f.name
		v.seconds = time.Since(t0).Seconds()
		fmt.Println(v.line())
		for _, why := range v.failures {
			fmt.Fprintf(os.Stderr, "chaos: %s: %s\n", f.name, why)
		}
		if len(v.failures) > 0 {
			failed++
		}
	}
	fmt.Fprintf(os.Stderr, "chaos: %d faults failed; took %s\n", failed, time.Since(start).Round(time.Second))
	if failed > 0 {
		os.Exit(1)
	}
}

// quietLogger drops go-redis's internal log lines.
type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}
