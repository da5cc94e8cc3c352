package config_test

import (
	"context"
	"os"
	"path/filepath"
	"testing"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/redispubsub"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

// TestUpstreamFilesReachTheAdapters hands what config left as transport
// options to each transport's own strict decoder, and builds the composite
// gates of the files (one with "gates" as a JSON string, one as an array).
func TestUpstreamFilesReachTheAdapters(t *testing.T) {
	read := func(name string) config.TransportConfig {
		t.Helper()
		data, err := os.ReadFile(filepath.Join("testdata", name))
		if err != nil {
			t.Fatal(err)
		}
		tc, err := config.ParseQueues(data, name)
		if err != nil {
			t.Fatal(err)
		}
		return tc
	}
	env := transport.Env{RedisURL: "redis://127.0.0.1:1/0"}

	ss := read("upstream-redis-sortedset.json")
	var so rss.Options
	if err := transport.DecodeOptions(ss.Options, &so); err != nil {
		t.Fatalf("redis-sortedset options: %v", err)
	}
	so.SetDefaults()
	if err := so.Validate(); err != nil {
		t.Fatalf("redis-sortedset options: %v", err)
	}
	if so.RetryQueueName != "{queue}:retry-sortedset" || so.UpstreamRetryQueueName != "retry-sortedset" {
		t.Errorf("flat retry_queue_name: %q (upstream %q)", so.RetryQueueName, so.UpstreamRetryQueueName)
	}
	if tp, err := rss.Factory(ss.Options, env); err != nil {
		t.Errorf("redis-sortedset factory: %v", err)
	} else {
		_ = tp.Close()
	}

	ps := read("upstream-redis-pubsub.json")
	tp, err := redispubsub.Factory(ps.Options, env)
	if err != nil {
		t.Fatalf("redis-pubsub factory: %v", err)
	}
	if got := tp.(*redispubsub.Transport).Options().RetryQueueName; got != "retry-sortedset" {
		t.Errorf("redis-pubsub retry_queue_name %q", got)
	}
	_ = tp.Close()

	gc := read("upstream-gcp-pubsub.json")
	tp, err = gcppubsub.Factory(gc.Options, env)
	if err != nil {
		t.Fatalf("gcp-pubsub factory: %v", err)
	}
	if o := tp.(*gcppubsub.Transport).Options(); o.ProjectID != "my-project" || o.BatchSize != 25 || o.MaxOutstandingMessages != 0 {
		t.Errorf("gcp-pubsub options %+v", o)
	}
	_ = tp.Close()

	reg := gate.NewRegistry()
	if err := reg.Register("composite", composite.Factory); err != nil {
		t.Fatal(err)
	}
	if err := reg.Register("constant", constant.Factory); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name string
		q    config.Queue
		want float64
	}{
		{"gates as a JSON string", ss.Queues[1], 0.5},
		{"gates as an array", gc.Queues[0], 0.25},
	} {
		t.Run(c.name, func(t *testing.T) {
			p, err := gate.ParseParams(c.q.GateParams)
			if err != nil {
				t.Fatal(err)
			}
			g, err := reg.New(c.q.GateType, p, gate.Env{MaxConcurrency: 1})
			if err != nil {
				t.Fatalf("build %s: %v", c.q.GateType, err)
			}
			defer func() {
				if cl, ok := g.(interface{ Close() error }); ok {
					_ = cl.Close()
				}
			}()
			b, err := g.Budget(context.Background())
			if err != nil || b != c.want {
				t.Fatalf("budget %v %v, want %v", b, err, c.want)
			}
		})
	}
}
