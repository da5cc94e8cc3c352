package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"cloud.google.com/go/pubsub/v2"
	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"cloud.google.com/go/pubsub/v2/pstest"
	"github.com/redis/go-redis/v9"
	"google.golang.org/api/option"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/internal/simulator"
	"github.com/sluice-io/sluice/internal/testenv"
)

var exampleTransports = []string{"memory", "redis-sortedset", "redis-pubsub", "redis-stream", "gcp-pubsub"}

func examplePath(transport string) string {
	return filepath.Join("..", "..", "examples", transport, "transport-config.json")
}

// TestExamplesValidate: every example transport config passes `sluice validate`.
func TestExamplesValidate(t *testing.T) {
	for _, tr := range exampleTransports {
		t.Run(tr, func(t *testing.T) {
			// The Redis URL comes from the deployment (REDIS_URL), not from the example.
			out, err := run(t, "validate", "--transport", tr, "--transport-config-file", examplePath(tr), "--redis.url", "redis://127.0.0.1:6379/0")
			if err != nil || !strings.HasPrefix(out, "ok: transport "+tr) {
				t.Fatalf("validate %s: %q %v", tr, out, err)
			}
		})
	}
}

// TestLegacyPubSubFlagsValidate: upstream's --redis.* and --pubsub.* families configure the transports.
func TestLegacyPubSubFlagsValidate(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"redis-pubsub", []string{"--message-queue-impl=redis-pubsub", "--redis.request-queue-name", "rq", "--redis.result-queue-name", "res",
			"--redis.retry-queue-name", "retries", "--redis.igw-base-url", "http://gw:80"}, "ok: transport redis-pubsub, 1 queue(s)"},
		{"gcp-pubsub", []string{"--message-queue-impl=gcp-pubsub", "--pubsub.project-id", "p", "--pubsub.request-subscriber-id", "sub",
			"--pubsub.result-topic-id", "results", "--pubsub.igw-base-url", "http://gw:80"}, "ok: transport gcp-pubsub, 1 queue(s)"},
		{"gcp-pubsub topics file", []string{"--message-queue-impl=gcp-pubsub", "--pubsub.project-id", "p", "--pubsub.result-topic-id", "results",
			"--pubsub.topics-config-file", writeFile(t, "topics.json", `[{"queue_name":"sub-a","igw_base_url":"http://gw:80"},{"queue_name":"sub-b","igw_base_url":"http://gw:80"}]`)},
			"ok: transport gcp-pubsub, 2 queue(s)"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			out, err := run(t, append([]string{"validate"}, tc.args...)...)
			if err != nil || !strings.HasPrefix(out, tc.want) {
				t.Fatalf("validate: %q %v, want %q", out, err, tc.want)
			}
		})
	}
}

// exampleServer is what one example runs against.
type exampleServer struct {
	// options are added to the example's transport options (server addresses).
	options map[string]any
	// produce enqueues one request on queue.
	produce func(t *testing.T, queue string, payload []byte)
	// result waits for one result on the queue's result destination.
	result func(t *testing.T, results string) []byte
}

func redisServer(t *testing.T, produce func(c *redis.Client, queue string, payload []byte) error) (exampleServer, string) {
	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	return exampleServer{
		options: map[string]any{},
		produce: func(t *testing.T, queue string, payload []byte) {
			if err := produce(c, queue, payload); err != nil {
				t.Fatalf("produce: %v", err)
			}
		},
		result: func(t *testing.T, results string) []byte {
			v, err := c.BRPop(context.Background(), 20*time.Second, results).Result()
			if err != nil {
				t.Fatalf("no result on %s: %v", results, err)
			}
			return []byte(v[1])
		},
	}, r.URL
}

// TestExamplesServe runs `sluice serve` on each example (with the gateway
// and server addresses of the test) until one request got its result.
func TestExamplesServe(t *testing.T) {
	sim, err := simulator.New(simulator.Config{})
	if err != nil {
		t.Fatal(err)
	}
	gw, err := sim.Start("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = sim.Close() })
	setups := map[string]func(t *testing.T, queue, results string) exampleServer{
		"redis-sortedset": func(t *testing.T, _, _ string) exampleServer {
			s, url := redisServer(t, func(c *redis.Client, q string, p []byte) error {
				return c.ZAdd(context.Background(), q, redis.Z{Score: float64(time.Now().Add(time.Hour).Unix()), Member: p}).Err()
			})
			s.options["url"] = url
			return s
		},
		"redis-pubsub": func(t *testing.T, _, _ string) exampleServer {
			s, url := redisServer(t, func(c *redis.Client, q string, p []byte) error {
				for deadline := time.Now().Add(30 * time.Second); c.PubSubNumSub(context.Background(), q).Val()[q] == 0; {
					if time.Now().After(deadline) {
						return fmt.Errorf("nobody subscribed to %s within 30s (did serve start?)", q)
					}
					time.Sleep(10 * time.Millisecond)
				}
				return c.Publish(context.Background(), q, p).Err()
			})
			s.options["url"] = url
			return s
		},
		"redis-stream": func(t *testing.T, _, _ string) exampleServer {
			s, url := redisServer(t, func(c *redis.Client, q string, p []byte) error {
				return c.XAdd(context.Background(), &redis.XAddArgs{Stream: q, Values: []any{"payload", p}}).Err()
			})
			s.options["url"] = url
			return s
		},
		"gcp-pubsub": func(t *testing.T, queue, results string) exampleServer {
			return pstestServer(t, queue, results)
		},
	}
	for _, tr := range exampleTransports[1:] {
		t.Run(tr, func(t *testing.T) {
			data, err := os.ReadFile(examplePath(tr))
			if err != nil {
				t.Fatal(err)
			}
			var doc map[string]any
			if err := json.Unmarshal(data, &doc); err != nil {
				t.Fatal(err)
			}
			queues := doc["queues"].([]any)
			for _, q := range queues {
				q.(map[string]any)["igw_base_url"] = gw
			}
			q0 := queues[0].(map[string]any)
			queue, results := q0["queue_name"].(string), doc["result_queue_name"].(string)
			srv := setups[tr](t, queue, results)
			for k, v := range srv.options {
				doc[k] = v
			}
			b, _ := json.Marshal(doc)
			f := writeFile(t, "transport-config.json", string(b))
			ctx, cancel := context.WithCancel(context.Background())
			done := make(chan error, 1)
			go func() {
				_, _, err := runCLI(t, ctx, "", "serve", "--transport", tr, "--transport-config-file", f,
					"--metrics-port", "-1", "--health-port", "-1", "--drain-timeout", "5s")
				done <- err
			}()
			payload := []byte(`{"id":"ex-1","deadline":` + itoa(time.Now().Add(time.Hour).Unix()) + `,"payload":{"prompt":"hi"},"metadata":{"job_id":"j"}}`)
			srv.produce(t, queue, payload)
			res, err := wire.DecodeResult(srv.result(t, results))
			cancel()
			if serr := <-done; serr != nil {
				t.Errorf("serve: %v", serr)
			}
			if err != nil || res.ID != "ex-1" || !res.OK() {
				t.Fatalf("result %+v, %v: want a success for ex-1", res, err)
			}
		})
	}
}

func itoa(n int64) string { b, _ := json.Marshal(n); return string(b) }

// pstestServer creates, on an in-process Pub/Sub fake, the example's request
// topic and subscription (queue), its result topic (results) and a
// subscription to read results.
func pstestServer(t *testing.T, queue, results string) exampleServer {
	srv := pstest.NewServer()
	t.Cleanup(func() { _ = srv.Close() })
	const project = "my-project"
	c, err := pubsub.NewClient(context.Background(), project, option.WithEndpoint(srv.Addr), option.WithoutAuthentication(),
		option.WithGRPCDialOption(grpc.WithTransportCredentials(insecure.NewCredentials())))
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = c.Close() })
	ctx := context.Background()
	name := func(kind, id string) string { return "projects/" + project + "/" + kind + "/" + id }
	for _, pair := range [][2]string{{queue + "-topic", queue}, {results, results + "-reader"}} {
		if _, err := c.TopicAdminClient.CreateTopic(ctx, &pubsubpb.Topic{Name: name("topics", pair[0])}); err != nil {
			t.Fatal(err)
		}
		if _, err := c.SubscriptionAdminClient.CreateSubscription(ctx, &pubsubpb.Subscription{
			Name: name("subscriptions", pair[1]), Topic: name("topics", pair[0]), AckDeadlineSeconds: 10}); err != nil {
			t.Fatal(err)
		}
	}
	return exampleServer{
		options: map[string]any{"emulator_host": srv.Addr},
		produce: func(t *testing.T, _ string, payload []byte) {
			p := c.Publisher(name("topics", queue+"-topic"))
			defer p.Stop()
			if _, err := p.Publish(ctx, &pubsub.Message{Data: payload}).Get(ctx); err != nil {
				t.Fatal(err)
			}
		},
		result: func(t *testing.T, _ string) []byte {
			rctx, cancel := context.WithTimeout(ctx, 20*time.Second)
			defer cancel()
			var got atomic.Value
			_ = c.Subscriber(name("subscriptions", results+"-reader")).Receive(rctx, func(_ context.Context, m *pubsub.Message) {
				m.Ack()
				got.Store(m.Data)
				cancel()
			})
			b, _ := got.Load().([]byte)
			if b == nil {
				t.Fatal("no result within 20s")
			}
			return b
		},
	}
}

// multiTenantExample is the worked multi-tenant config (examples/multi-tenant).
var multiTenantExample = filepath.Join("..", "..", "examples", "multi-tenant", "sluice.json")

// TestMultiTenantExample: `sluice validate` accepts the multi-tenant example,
// and `sluice serve` runs it (which also builds its pool gate, which validate
// does not), with the test's addresses, against a real redis-server,
// Prometheus and gateway simulator, until one request of each tier is
// answered and counted against its tenant's quota in Redis.
func TestMultiTenantExample(t *testing.T) {
	out, err := run(t, "validate", "--config", multiTenantExample, "--redis.url", "redis://127.0.0.1:6379/0")
	if err != nil || !strings.HasPrefix(out, "ok: transport redis-sortedset, 3 queue(s)") {
		t.Fatalf("validate: %q %v", out, err)
	}

	r := testenv.StartRedis(t, testenv.RedisOptions{})
	c := testenv.RedisClient(t, r.URL)
	gauges := testenv.StartGauges(t)
	gauges.Set("inference_extension_flow_control_pool_saturation", 0.1, "inference_pool", "pool-a")
	prom := testenv.StartPrometheus(t, []string{gauges.URL()}, 500*time.Millisecond)
	gw := startSim(t, simulator.Config{})

	data, err := os.ReadFile(multiTenantExample)
	if err != nil {
		t.Fatal(err)
	}
	var doc map[string]any
	if err := json.Unmarshal(data, &doc); err != nil {
		t.Fatal(err)
	}
	doc["prometheus"].(map[string]any)["url"] = prom.URL
	tc := doc["transport_config"].(map[string]any)
	tc["url"], tc["poll_interval_ms"] = r.URL, 100
	queues := map[string]string{} // tier → queue name
	for _, q := range tc["queues"].([]any) {
		q := q.(map[string]any)
		q["igw_base_url"] = gw
		q["gate_params"].(map[string]any)["address"] = r.Addr
		queues[q["labels"].(map[string]any)["tier"].(string)] = q["queue_name"].(string)
	}
	b, err := json.Marshal(doc)
	if err != nil {
		t.Fatal(err)
	}
	f := writeFile(t, "sluice.json", string(b))

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		_, _, err := runCLI(t, ctx, "", "serve", "--config", f, "--metrics-port", "-1", "--health-port", "-1", "--drain-timeout", "5s")
		done <- err
	}()
	deadline := time.Now().Add(time.Hour)
	for tier, queue := range queues {
		payload := fmt.Sprintf(`{"id":"mt-%s","deadline":%d,"payload":{"model":"m","messages":[{"role":"user","content":"hi"}]},"metadata":{"userid":"acme"}}`,
			tier, deadline.Unix())
		if err := c.ZAdd(ctx, queue, redis.Z{Score: float64(deadline.Unix()), Member: payload}).Err(); err != nil {
			t.Fatal(err)
		}
	}
	got := map[string]bool{}
	for range queues {
		v, err := c.BRPop(context.Background(), 20*time.Second, tc["result_queue_name"].(string)).Result()
		if err != nil {
			cancel()
			t.Fatalf("results so far %v; no more within 20s: %v", got, err)
		}
		res, err := wire.DecodeResult([]byte(v[1]))
		if err != nil || !res.OK() {
			t.Errorf("result %s: %+v, %v; want a success", v[1], res, err)
			continue
		}
		got[res.ID] = true
	}
	cancel()
	if err := <-done; err != nil {
		t.Errorf("serve: %v", err)
	}
	for tier := range queues {
		if !got["mt-"+tier] {
			t.Errorf("no result for the %s request (results: %v)", tier, got)
		}
		// Each request took a slot of acme's quota for its tier (the
		// counter stays, at 0, once the slot is given back).
		if n := c.Exists(context.Background(), "quota:"+tier+":userid:acme").Val(); n != 1 {
			t.Errorf("quota:%s:userid:acme: not in Redis; the queue's quota gate did not count the request", tier)
		}
	}
}
