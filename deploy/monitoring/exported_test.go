package monitoring

import (
	"maps"
	"regexp"
	"slices"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	dto "github.com/prometheus/client_model/go"

	"github.com/sluice-io/sluice/core/metrics"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/redisleasedrate"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// targetLabels are the labels Prometheus attaches to every scraped series:
// job and instance, and what the prometheus-operator's PodMonitor and
// ServiceMonitor add. Queries may use them on any metric.
var targetLabels = []string{"job", "instance", "namespace", "pod", "container", "endpoint", "service"}

// exports is what sluice exports: every series name (histograms as their
// _bucket, _sum and _count series) with the label names it carries, and
// the known values of the labels whose values are a closed set.
type exports struct {
	series map[string]map[string]bool // series name → label names
	values map[string][]string        // label name → every value sluice writes
}

// recorder is a Registerer that keeps every collector registered through it.
type recorder struct {
	prometheus.Registerer
	collectors []prometheus.Collector
}

// Register implements prometheus.Registerer.
func (r *recorder) Register(c prometheus.Collector) error {
	if err := r.Registerer.Register(c); err != nil {
		return err
	}
	r.collectors = append(r.collectors, c)
	return nil
}

// MustRegister implements prometheus.Registerer.
func (r *recorder) MustRegister(cs ...prometheus.Collector) {
	for _, c := range cs {
		if err := r.Register(c); err != nil {
			panic(err)
		}
	}
}

// eventCounters are the transports that count events of their own
// (sluice_transport_events_total), as zero values: Events only reads their
// counters, which is all the names need.
func eventCounters() map[string]transport.EventCounter {
	return map[string]transport.EventCounter{
		"redis-sortedset": new(redissortedset.Transport),
		"redis-pubsub":    new(redispubsub.Transport),
		"redis-stream":    new(redisstream.Transport),
		"gcp-pubsub":      new(gcppubsub.Transport),
	}
}

// descRE takes a prometheus.Desc apart (its String form: the only way to
// read a Desc's name and labels from outside client_golang).
var descRE = regexp.MustCompile(`(?s)^Desc\{fqName: "([^"]*)", help: .*, constLabels: \{(.*)\}, variableLabels: \{([^{}]*)\}\}$`)

// constLabelRE is one name="value" pair of a Desc's constLabels.
var constLabelRE = regexp.MustCompile(`([A-Za-z_][A-Za-z0-9_]*)="(?:[^"\\]|\\.)*"`)

// sluiceExports builds the set from a real registry: core/metrics' New, the
// collectors the gates register of their own (gate.Env.Metrics and
// PoolMetrics), the transport events collector of every transport that
// has one, and the Go
// and process collectors core/app registers. Names and labels come from
// each collector's Describe, types from the collector's Go type and, for
// what a Gather returns, from the gathered family.
func sluiceExports(t testing.TB) *exports {
	t.Helper()
	reg := prometheus.NewRegistry()
	rec := &recorder{Registerer: reg}
	m, err := metrics.New(rec)
	if err != nil {
		t.Fatalf("metrics.New: %v", err)
	}
	m.For(metrics.Labels{QueueID: "q", QueueName: "q", Pool: "default"}) // creates the per-queue series
	// The deadline-proximity histogram is a snapshot collector: one snapshot gives it its series.
	m.DeadlineProximity.Set(metrics.Labels{QueueID: "q", QueueName: "q", Pool: "default"},
		metrics.Proximity{Cumulative: make([]uint64, len(metrics.ProximityBounds))})

	// A deployment registers the collector of its one transport; here one
	// collector carries the events of them all.
	events := map[string]int64{}
	for _, ec := range eventCounters() {
		maps.Copy(events, ec.Events())
	}
	rec.MustRegister(metrics.NewEventsCollector("all", func() map[string]int64 { return events }))
	// The gates register their own series through gate.Env.Metrics, which
	// adds the gate label: the plugin gate (events, one series per RPC)
	// and the aimd gate (events, one window per band). The plugin gate's
	// event names are a closed set.
	gates := prometheus.WrapRegistererWith(prometheus.Labels{"gate": "g"}, rec)
	plugin := new(host.Gate)
	if err := plugin.RegisterMetrics(gates); err != nil {
		t.Fatalf("plugin gate metrics: %v", err)
	}
	maps.Copy(events, plugin.Events())
	g, err := aimd.New(aimd.Config{MaxConcurrency: 1})
	if err != nil {
		t.Fatalf("aimd.New: %v", err)
	}
	if err := g.RegisterMetrics(gates); err != nil {
		t.Fatalf("aimd gate metrics: %v", err)
	}
	// The redis-leased-rate gate's drain_limit gauges, registered on
	// gate.Env.PoolMetrics (labelled pool_name by the gate).
	if _, err := redisleasedrate.LeaseGauges(rec, "p"); err != nil {
		t.Fatalf("lease gauges: %v", err)
	}
	rec.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	kinds := map[string]dto.MetricType{}
	labels := map[string]map[string]bool{}
	for _, c := range rec.collectors {
		kind := dto.MetricType_UNTYPED
		switch c.(type) { // a vec gathers nothing until touched; the rest is typed by Gather below
		case *prometheus.HistogramVec:
			kind = dto.MetricType_HISTOGRAM
		case *prometheus.SummaryVec:
			kind = dto.MetricType_SUMMARY
		}
		ch := make(chan *prometheus.Desc, 64)
		go func() { c.Describe(ch); close(ch) }()
		for d := range ch {
			sm := descRE.FindStringSubmatch(d.String())
			if sm == nil {
				t.Fatalf("cannot read descriptor %s", d)
			}
			name := sm[1]
			ls := map[string]bool{}
			for _, l := range constLabelRE.FindAllStringSubmatch(sm[2], -1) {
				ls[l[1]] = true
			}
			for l := range strings.SplitSeq(sm[3], ",") {
				if l = strings.TrimSuffix(strings.TrimPrefix(l, "c("), ")"); l != "" {
					ls[l] = true
				}
			}
			labels[name] = ls
			kinds[name] = kind
		}
	}
	mfs, err := reg.Gather()
	if err != nil {
		t.Fatalf("gather: %v", err)
	}
	for _, mf := range mfs {
		if _, ok := labels[mf.GetName()]; !ok {
			t.Fatalf("%s was gathered but not described", mf.GetName())
		}
		kinds[mf.GetName()] = mf.GetType()
	}
	// Spot checks that the set is built from what it should be.
	for _, want := range []string{metrics.Upstream + "request_total", "sluice_results_total", "sluice_transport_events_total", "go_goroutines"} {
		if _, ok := labels[want]; !ok {
			t.Fatalf("the registry has no %s: the set of exported metrics is built wrong", want)
		}
	}

	ex := &exports{series: map[string]map[string]bool{}, values: map[string][]string{
		"code":    metrics.ResultCodes,
		"reason":  metrics.DecisionReasons,
		"verdict": metrics.Verdicts,
		"event":   slices.Sorted(maps.Keys(events)),
	}}
	for name, ls := range labels {
		switch kinds[name] {
		case dto.MetricType_HISTOGRAM, dto.MetricType_GAUGE_HISTOGRAM:
			ex.series[name+"_bucket"] = with(ls, "le")
			ex.series[name+"_sum"] = ls
			ex.series[name+"_count"] = ls
		case dto.MetricType_SUMMARY:
			ex.series[name] = with(ls, "quantile")
			ex.series[name+"_sum"] = ls
			ex.series[name+"_count"] = ls
		default:
			ex.series[name] = ls
		}
	}
	return ex
}

// with returns a copy of ls with l added.
func with(ls map[string]bool, l string) map[string]bool {
	out := maps.Clone(ls)
	out[l] = true
	return out
}

// family is the metric a series belongs to: its name without the _bucket,
// _sum or _count suffix of a histogram or summary.
func (ex *exports) family(series string) string {
	for _, s := range []string{"_bucket", "_sum", "_count"} {
		base, ok := strings.CutSuffix(series, s)
		if !ok {
			continue
		}
		if _, isHist := ex.series[base+"_bucket"]; isHist {
			return base
		}
		if ls, isSummary := ex.series[base]; isSummary && ls["quantile"] {
			return base
		}
	}
	return series
}

func TestExportsAreBuiltFromTheRegistry(t *testing.T) {
	ex := sluiceExports(t)
	for series, wantLabels := range map[string][]string{
		metrics.Upstream + "message_latency_time_millis_bucket": {"queue_id", "queue_name", "pool_name", "le"},
		metrics.Upstream + "pool_worker_limit":                  {"pool_name"},
		metrics.Upstream + "gate_metric_value":                  {"queue_id", "queue_name", "pool_name", "inference_pool"},
		"sluice_gate_budget":                                    {"gate"},
		"sluice_transport_events_total":                         {"transport", "event"},
		"sluice_gate_events_total":                              {"gate", "event"},
		"sluice_gate_plugin_call_seconds_bucket":                {"gate", "rpc", "le"},
		"sluice_gate_plugin_call_failures_total":                {"gate", "rpc"},
		"go_gc_duration_seconds":                                {"quantile"},
	} {
		got, ok := ex.series[series]
		if !ok {
			t.Errorf("%s is missing", series)
			continue
		}
		if !slices.Equal(slices.Sorted(maps.Keys(got)), slices.Sorted(slices.Values(wantLabels))) {
			t.Errorf("%s has labels %v, want %v", series, slices.Sorted(maps.Keys(got)), wantLabels)
		}
	}
	if _, ok := ex.series[metrics.Upstream+"message_latency_time_millis"]; ok {
		t.Errorf("a classic histogram has no series of its bare name")
	}
	if got := ex.family("sluice_dispatch_wait_millis_count"); got != "sluice_dispatch_wait_millis" {
		t.Errorf("family of a histogram's _count = %q", got)
	}
	if got := ex.family("sluice_results_total"); got != "sluice_results_total" {
		t.Errorf("family of a counter = %q", got)
	}
	for _, e := range []string{"late_results", "reclaimed", "lost_leases", "requests_unheard", "receive_errors"} {
		if !slices.Contains(ex.values["event"], e) {
			t.Errorf("transport event %q is not among %v", e, ex.values["event"])
		}
	}
}
