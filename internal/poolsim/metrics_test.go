package poolsim

import (
	"context"
	"net/http"
	"sort"
	"strings"
	"testing"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// scrape GETs url and parses the text exposition (the format Prometheus
// negotiates without protobuf).
func scrape(t testing.TB, c *http.Client, url string) map[string]*dto.MetricFamily {
	t.Helper()
	req, _ := http.NewRequest(http.MethodGet, url, nil)
	req.Header.Set("Accept", "text/plain;version=0.0.4")
	resp, err := c.Do(req)
	if err != nil {
		t.Fatalf("GET %s: %v", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != 200 {
		t.Fatalf("GET %s: %s", url, resp.Status)
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("GET %s: exposition: %v", url, err)
	}
	return fams
}

func labelNames(m *dto.Metric) string {
	var names []string
	for _, l := range m.GetLabel() {
		names = append(names, l.GetName())
	}
	sort.Strings(names)
	return strings.Join(names, ",")
}

func label(m *dto.Metric, name string) string {
	for _, l := range m.GetLabel() {
		if l.GetName() == name {
			return l.GetValue()
		}
	}
	return ""
}

// value returns the value of the first series of fam matching every
// name=value pair in match.
func value(t testing.TB, fams map[string]*dto.MetricFamily, fam string, match ...string) float64 {
	t.Helper()
	f := fams[fam]
	if f == nil {
		t.Fatalf("no family %s", fam)
	}
next:
	for _, m := range f.GetMetric() {
		for i := 0; i+1 < len(match); i += 2 {
			if label(m, match[i]) != match[i+1] {
				continue next
			}
		}
		switch f.GetType() {
		case dto.MetricType_GAUGE:
			return m.GetGauge().GetValue()
		case dto.MetricType_COUNTER:
			return m.GetCounter().GetValue()
		case dto.MetricType_HISTOGRAM:
			return float64(m.GetHistogram().GetSampleCount())
		}
	}
	t.Fatalf("no series of %s matches %v", fam, match)
	return 0
}

func TestMetricNamesAndTypes(t *testing.T) {
	cfg := Config{}
	cfg.Front.FlushInterval = 20 * time.Millisecond
	_, base, c := startPool(t, cfg)
	resp, body := post(t, c, base+PathCompletions, `{"prompt":"hello","max_tokens":3}`)
	if resp.StatusCode != 200 {
		t.Fatalf("warm-up request: %d %s", resp.StatusCode, body)
	}
	gauge, counter, histogram := dto.MetricType_GAUGE, dto.MetricType_COUNTER, dto.MetricType_HISTOGRAM
	vllm := map[string]dto.MetricType{
		MetricRunning: gauge, MetricWaiting: gauge, MetricKVCacheUsage: gauge, MetricGPUCacheUsage: gauge,
		MetricPreemptions: counter, MetricPromptTokens: counter, MetricGenerationTokens: counter, MetricRequestSuccess: counter,
		MetricTTFT: histogram, MetricTPOT: histogram, MetricITL: histogram, MetricE2E: histogram, MetricQueueTime: histogram,
		MetricInferenceTime: histogram, MetricPrefillTime: histogram, MetricDecodeTime: histogram, MetricIterationTokens: histogram,
		MetricCacheConfig:   gauge,
		MetricEngineRunning: gauge, MetricEngineWaiting: gauge, MetricStepSeconds: histogram, MetricStepLag: histogram,
	}
	podLabels := func(name string) string {
		switch name {
		case MetricRequestSuccess:
			return "engine,finished_reason,model_name"
		case MetricCacheConfig:
			return "block_size,engine,num_gpu_blocks"
		case MetricEngineRunning, MetricEngineWaiting:
			return "class,engine,model_name"
		}
		return "engine,model_name"
	}

	t.Run("pod", func(t *testing.T) {
		fams := scrape(t, c, base+PodPrefix+"0"+PathMetrics)
		for name, typ := range vllm {
			f := fams[name]
			if f == nil {
				t.Errorf("pod metrics lack %s", name)
				continue
			}
			if f.GetType() != typ {
				t.Errorf("%s is a %v, want a %v", name, f.GetType(), typ)
			}
			for _, m := range f.GetMetric() {
				if got := labelNames(m); got != podLabels(name) {
					t.Errorf("%s labels %s, want %s", name, got, podLabels(name))
				}
			}
		}
		if v := value(t, fams, MetricCacheConfig, "block_size", "16", "num_gpu_blocks", "768"); v != 1 {
			t.Errorf("%s = %v, want 1", MetricCacheConfig, v)
		}
	})

	t.Run("front", func(t *testing.T) {
		fams := scrape(t, c, base+PathMetrics)
		for name, typ := range vllm {
			f := fams[name]
			if f == nil || f.GetType() != typ {
				t.Errorf("front metrics: %s missing or not a %v", name, typ)
				continue
			}
			pods := map[string]bool{}
			for _, m := range f.GetMetric() {
				want := podLabels(name) + ",inference_pool,pod"
				names := strings.Split(want, ",")
				sort.Strings(names)
				if got := labelNames(m); got != strings.Join(names, ",") {
					t.Errorf("%s labels %s, want %s", name, got, strings.Join(names, ","))
				}
				pods[label(m, "pod")] = true
			}
			if !pods["pod-0"] || !pods["pod-1"] {
				t.Errorf("%s: pods %v, want pod-0 and pod-1", name, pods)
			}
		}
		// The warm-up request's tokens are counted on the pod that served it.
		gen := value(t, fams, MetricGenerationTokens, "pod", "pod-0") + value(t, fams, MetricGenerationTokens, "pod", "pod-1")
		if gen != 3 {
			t.Errorf("generation tokens %v, want 3", gen)
		}
		if n := value(t, fams, MetricRequestSuccess, "pod", "pod-0", "finished_reason", "length") +
			value(t, fams, MetricRequestSuccess, "pod", "pod-1", "finished_reason", "length"); n != 1 {
			t.Errorf("request_success{finished_reason=length} %v, want 1", n)
		}
		epp := []struct {
			name   string
			typ    dto.MetricType
			labels string
		}{
			{MetricPoolSaturation, gauge, "inference_pool,stage"},
			{MetricPoolSaturationOld, gauge, "inference_pool,stage"},
			{MetricStaleEndpoints, gauge, "detector"},
			{MetricAvgKVOld, gauge, "name"}, {MetricAvgQueueOld, gauge, "name"}, {MetricAvgRunningOld, gauge, "name"},
			{MetricReadyPodsOld, gauge, "name"}, {MetricAvgKV, gauge, "name"}, {MetricAvgQueue, gauge, "name"},
			{MetricAvgRunning, gauge, "name"}, {MetricReadyEndpoints, gauge, "name"},
			{MetricSDKV, gauge, "name"}, {MetricSDQueue, gauge, "name"}, {MetricSDRunning, gauge, "name"},
			{MetricPerPodQueueSize, gauge, "model_server_pod,name"},
		}
		for _, e := range epp {
			f := fams[e.name]
			if f == nil || f.GetType() != e.typ || len(f.GetMetric()) == 0 {
				t.Errorf("front metrics: %s missing or not a %v", e.name, e.typ)
				continue
			}
			for _, m := range f.GetMetric() {
				if got := labelNames(m); got != e.labels {
					t.Errorf("%s labels %s, want %s", e.name, got, e.labels)
				}
			}
		}
		for _, stage := range []string{"decode", "effective"} {
			value(t, fams, MetricPoolSaturation, "inference_pool", DefaultPoolName, "stage", stage)
			value(t, fams, MetricPoolSaturationOld, "inference_pool", DefaultPoolName, "stage", stage)
		}
		if v := value(t, fams, MetricReadyPodsOld, "name", DefaultPoolName); v != 2 {
			t.Errorf("%s = %v, want 2", MetricReadyPodsOld, v)
		}
		if v := value(t, fams, MetricStaleEndpoints, "detector", "utilization-detector"); v != 0 {
			t.Errorf("%s = %v, want 0", MetricStaleEndpoints, v)
		}
		// Passthrough runs no flow control: no queue series, as the EPP.
		if fams[MetricQueueSize] != nil || fams[MetricQueueSizeOld] != nil {
			t.Errorf("passthrough exports flow-control queue series")
		}
	})
}

func TestFlushInterval(t *testing.T) {
	cfg := Config{Pods: 1}
	cfg.Front.FlushInterval = time.Hour // only the flush at start
	p, base, c := startPool(t, cfg)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	defer func() { cancel(); <-done }()
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+PathCompletions, strings.NewReader(`{"prompt":"x","max_tokens":300}`))
		if resp, err := c.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	waitFor(t, "a running request", func() bool { return p.PodGauges()[0].Running == 1 })
	time.Sleep(3 * DefaultRefreshInterval)
	fams := scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricAvgRunningOld, "name", DefaultPoolName); v != 0 {
		t.Fatalf("%s = %v between flushes, want the value of the flush at start (0)", MetricAvgRunningOld, v)
	}
	if v := value(t, fams, MetricRunning, "pod", "pod-0"); v != 1 {
		t.Fatalf("%s = %v, want 1 (read at scrape time)", MetricRunning, v)
	}
	if v := value(t, fams, MetricPerPodQueueSize, "model_server_pod", "pod-0"); v != 0 {
		t.Fatalf("%s = %v, want 0", MetricPerPodQueueSize, v)
	}
	p.front.flush(time.Now())
	fams = scrape(t, c, base+PathMetrics)
	if v := value(t, fams, MetricAvgRunningOld, "name", DefaultPoolName); v != 1 {
		t.Fatalf("%s = %v after a flush, want 1", MetricAvgRunningOld, v)
	}
}
