package poolsim

import (
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
)

// vLLM series of every pod (vllm/v1/metrics/loggers.py), labelled
// model_name and engine; on the front's /metrics also pod and
// inference_pool.
const (
	MetricRunning          = "vllm:num_requests_running"
	MetricWaiting          = "vllm:num_requests_waiting"
	MetricKVCacheUsage     = "vllm:kv_cache_usage_perc"
	MetricGPUCacheUsage    = "vllm:gpu_cache_usage_perc" // deprecated name of the same gauge
	MetricPreemptions      = "vllm:num_preemptions_total"
	MetricPromptTokens     = "vllm:prompt_tokens_total"
	MetricGenerationTokens = "vllm:generation_tokens_total"
	MetricRequestSuccess   = "vllm:request_success_total"
	MetricTTFT             = "vllm:time_to_first_token_seconds"
	MetricTPOT             = "vllm:time_per_output_token_seconds"
	MetricITL              = "vllm:inter_token_latency_seconds"
	MetricE2E              = "vllm:e2e_request_latency_seconds"
	MetricQueueTime        = "vllm:request_queue_time_seconds"
	MetricInferenceTime    = "vllm:request_inference_time_seconds"
	MetricPrefillTime      = "vllm:request_prefill_time_seconds"
	MetricDecodeTime       = "vllm:request_decode_time_seconds"
	MetricIterationTokens  = "vllm:iteration_tokens_total"
	MetricCacheConfig      = "vllm:cache_config_info"
	MetricPrefixQueries    = "vllm:prefix_cache_queries_total"
	MetricPrefixHits       = "vllm:prefix_cache_hits_total"
)

// The simulator's own per-pod series.
const (
	MetricEngineRunning = "simulator_engine_running"
	MetricEngineWaiting = "simulator_engine_waiting"
	MetricStepSeconds   = "simulator_engine_step_seconds"
	MetricStepLag       = "simulator_engine_step_lag_seconds"
)

// The front's EPP series (llm-d-router pkg/epp/metrics), each with its
// deprecated twin where the EPP still writes one.
const (
	MetricPoolSaturation        = "llm_d_epp_flow_control_pool_saturation"
	MetricPoolSaturationOld     = "inference_extension_flow_control_pool_saturation"
	MetricQueueSize             = "llm_d_epp_flow_control_queue_size"
	MetricQueueSizeOld          = "inference_extension_flow_control_queue_size"
	MetricFlowRequests          = "llm_d_epp_flow_control_requests_total"
	MetricStaleEndpoints        = "llm_d_epp_flow_control_stale_endpoints"
	MetricAvgKVOld              = "inference_pool_average_kv_cache_utilization"
	MetricAvgQueueOld           = "inference_pool_average_queue_size"
	MetricAvgRunningOld         = "inference_pool_average_running_requests"
	MetricReadyPodsOld          = "inference_pool_ready_pods"
	MetricAvgKV                 = "llm_d_epp_average_kv_cache_utilization"
	MetricAvgQueue              = "llm_d_epp_average_queue_size"
	MetricAvgRunning            = "llm_d_epp_average_running_requests"
	MetricSDKV                  = "llm_d_epp_std_dev_kv_cache_utilization"
	MetricSDQueue               = "llm_d_epp_std_dev_queue_size"
	MetricSDRunning             = "llm_d_epp_std_dev_running_requests"
	MetricReadyEndpoints        = "llm_d_epp_ready_endpoints"
	MetricPerPodQueueSize       = "inference_pool_per_pod_queue_size"
	MetricFrontRejections       = "simulator_front_rejections_total"
	MetricFrontSaturationLive   = "simulator_front_saturation"
	stageDecode, stageEffective = "decode", "effective"
)

// vllmDescs are the descriptors of one pod's series with a given label set.
type vllmDescs struct {
	running, waiting, kv, gpu, preempt, prompt, gen, success *prometheus.Desc
	prefixQueries, prefixHits                                *prometheus.Desc
	ttft, tpot, itl, e2e, queue, inference, prefill, decode  *prometheus.Desc
	iter, cacheInfo, engRunning, engWaiting, step, lag       *prometheus.Desc
}

func newVLLMDescs(extra ...string) *vllmDescs {
	base := append([]string{"model_name", "engine"}, extra...)
	d := func(name, help string, more ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, append(slices.Clone(base), more...), nil)
	}
	info := append([]string{"block_size", "num_gpu_blocks", "engine"}, extra...)
	return &vllmDescs{
		running:       d(MetricRunning, "Number of requests in model execution batches."),
		waiting:       d(MetricWaiting, "Number of requests waiting to be processed."),
		kv:            d(MetricKVCacheUsage, "KV-cache usage. 1 means 100 percent usage."),
		gpu:           d(MetricGPUCacheUsage, "GPU KV-cache usage. 1 means 100 percent usage (deprecated name)."),
		preempt:       d(MetricPreemptions, "Cumulative number of preemptions from the engine."),
		prompt:        d(MetricPromptTokens, "Number of prefill tokens processed."),
		gen:           d(MetricGenerationTokens, "Number of generation tokens processed."),
		success:       d(MetricRequestSuccess, "Count of successfully processed requests.", "finished_reason"),
		prefixQueries: d(MetricPrefixQueries, "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    d(MetricPrefixHits, "Prefix cache hits, in terms of number of cached tokens."),
		ttft:          d(MetricTTFT, "Histogram of time to first token in seconds."),
		tpot:          d(MetricTPOT, "Histogram of time per output token in seconds."),
		itl:           d(MetricITL, "Histogram of inter-token latency in seconds."),
		e2e:           d(MetricE2E, "Histogram of e2e request latency in seconds."),
		queue:         d(MetricQueueTime, "Histogram of time spent in WAITING phase for request."),
		inference:     d(MetricInferenceTime, "Histogram of time spent in RUNNING phase for request."),
		prefill:       d(MetricPrefillTime, "Histogram of time spent in PREFILL phase for request."),
		decode:        d(MetricDecodeTime, "Histogram of time spent in DECODE phase for request."),
		iter:          d(MetricIterationTokens, "Histogram of number of tokens per engine step."),
		cacheInfo:     prometheus.NewDesc(MetricCacheConfig, "Information of the KV cache config.", info, nil),
		engRunning:    d(MetricEngineRunning, "Requests running in the engine, by class (simulator).", "class"),
		engWaiting:    d(MetricEngineWaiting, "Requests waiting in the engine, by class (simulator).", "class"),
		step:          d(MetricStepSeconds, "Simulated duration of engine steps (simulator)."),
		lag:           d(MetricStepLag, "How late engine steps ended against their absolute deadlines (simulator)."),
	}
}

func (v *vllmDescs) describe(ch chan<- *prometheus.Desc) {
	for _, d := range []*prometheus.Desc{v.running, v.waiting, v.kv, v.gpu, v.preempt, v.prompt, v.gen, v.success,
		v.prefixQueries, v.prefixHits, v.ttft, v.tpot, v.itl, v.e2e, v.queue, v.inference, v.prefill, v.decode, v.iter, v.cacheInfo,
		v.engRunning, v.engWaiting, v.step, v.lag} {
		ch <- d
	}
}

// collect emits pod d's series; extra are the values of the extra labels.
func (v *vllmDescs) collect(ch chan<- prometheus.Metric, p *Pool, d *pod, extra ...string) {
	lv := append([]string{p.cfg.ModelName, "0"}, extra...)
	with := func(more ...string) []string { return append(slices.Clone(lv), more...) }
	gauge := func(desc *prometheus.Desc, x float64, labels []string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, x, labels...)
	}
	counter := func(desc *prometheus.Desc, x float64, labels []string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.CounterValue, x, labels...)
	}
	histo := func(desc *prometheus.Desc, h *hist) {
		ch <- prometheus.MustNewConstHistogram(desc, h.n, h.sum, h.cumulative(), lv...)
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	g := d.gaugesLocked()
	m := &d.m
	gauge(v.running, float64(g.Running), lv)
	gauge(v.waiting, float64(g.Waiting), lv)
	gauge(v.kv, g.KVUsage, lv)
	gauge(v.gpu, g.KVUsage, lv)
	counter(v.preempt, float64(g.Preemptions), lv)
	counter(v.prompt, float64(m.promptTokens), lv)
	counter(v.gen, float64(m.generationTokens), lv)
	counter(v.prefixQueries, float64(d.eng.prefixQueries), lv)
	counter(v.prefixHits, float64(d.eng.prefixHits), lv)
	for _, r := range []string{finishStop, finishLength, finishAbort} {
		counter(v.success, float64(m.success[r]), with(r))
	}
	histo(v.ttft, &m.ttft)
	histo(v.tpot, &m.itl)
	histo(v.itl, &m.itl)
	histo(v.e2e, &m.e2e)
	histo(v.queue, &m.queue)
	histo(v.inference, &m.inference)
	histo(v.prefill, &m.prefill)
	histo(v.decode, &m.decode)
	histo(v.iter, &m.iterTokens)
	histo(v.step, &m.stepSec)
	histo(v.lag, &m.lagSec)
	gauge(v.cacheInfo, 1, append([]string{strconv.Itoa(d.eng.cfg.BlockSize), strconv.Itoa(d.eng.numBlocks), "0"}, extra...))
	for _, c := range Classes {
		gauge(v.engRunning, float64(g.RunningByClass[c]), with(c.String()))
		gauge(v.engWaiting, float64(g.WaitingByClass[c]), with(c.String()))
	}
}

// podCollector serves one pod's /pods/{i}/metrics: its series labelled as
// vLLM labels them.
type podCollector struct {
	p *Pool
	d *pod
	v *vllmDescs
}

func (c *podCollector) Describe(ch chan<- *prometheus.Desc) { c.v.describe(ch) }
func (c *podCollector) Collect(ch chan<- prometheus.Metric) { c.v.collect(ch, c.p, c.d) }

func podMetricsHandler(p *Pool, d *pod) (http.Handler, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(&podCollector{p: p, d: d, v: newVLLMDescs()}); err != nil {
		return nil, err
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}), nil
}

// frontCollector serves the front's /metrics: the EPP's series and every
// pod's vLLM series labelled pod and inference_pool.
type frontCollector struct {
	p                                         *Pool
	v                                         *vllmDescs
	sat, satOld, qs, qsOld, reqs, stale       *prometheus.Desc
	avgKV, avgQ, avgRun, ready                *prometheus.Desc
	avgKVNew, avgQNew, avgRunNew, readyNew    *prometheus.Desc
	sdKV, sdQ, sdRun, perPod, rejects, satNow *prometheus.Desc
}

func newFrontCollector(p *Pool) *frontCollector {
	d := func(name, help string, labels ...string) *prometheus.Desc {
		return prometheus.NewDesc(name, help, labels, nil)
	}
	queue := []string{"fairness_id", "priority", "inference_pool", "model_name", "target_model_name"}
	const satHelp = "Saturation of the pool as the flow controller's detector sees it (1.0 is the gating set point)."
	return &frontCollector{
		p:         p,
		v:         newVLLMDescs("pod", "inference_pool"),
		sat:       d(MetricPoolSaturation, satHelp, "inference_pool", "stage"),
		satOld:    d(MetricPoolSaturationOld, satHelp+" Deprecated name.", "inference_pool", "stage"),
		qs:        d(MetricQueueSize, "Requests held in the flow controller.", queue...),
		qsOld:     d(MetricQueueSizeOld, "Requests held in the flow controller. Deprecated name.", queue...),
		reqs:      d(MetricFlowRequests, "Requests finalised by the flow controller, by outcome.", "outcome", "priority", "inference_pool"),
		stale:     d(MetricStaleEndpoints, "Endpoints whose metrics were missing or stale at the last detection.", "detector"),
		avgKV:     d(MetricAvgKVOld, "Average KV-cache utilization of the pool.", "name"),
		avgQ:      d(MetricAvgQueueOld, "Average queue size of the pool.", "name"),
		avgRun:    d(MetricAvgRunningOld, "Average running requests of the pool.", "name"),
		ready:     d(MetricReadyPodsOld, "Ready pods of the pool.", "name"),
		avgKVNew:  d(MetricAvgKV, "Average KV-cache utilization of the pool.", "name"),
		avgQNew:   d(MetricAvgQueue, "Average queue size of the pool.", "name"),
		avgRunNew: d(MetricAvgRunning, "Average running requests of the pool.", "name"),
		readyNew:  d(MetricReadyEndpoints, "Ready endpoints of the pool.", "name"),
		sdKV:      d(MetricSDKV, "Standard deviation of the KV-cache utilization of the pool.", "name"),
		sdQ:       d(MetricSDQueue, "Standard deviation of the queue size of the pool.", "name"),
		sdRun:     d(MetricSDRunning, "Standard deviation of the running requests of the pool.", "name"),
		perPod:    d(MetricPerPodQueueSize, "Queue size of each pod at the front's last read.", "name", "model_server_pod"),
		rejects:   d(MetricFrontRejections, "Requests the front refused, by reason (simulator).", "reason"),
		satNow:    d(MetricFrontSaturationLive, "Saturation recomputed at scrape time from the last pod reads (simulator)."),
	}
}

func (c *frontCollector) Describe(ch chan<- *prometheus.Desc) {
	c.v.describe(ch)
	for _, d := range []*prometheus.Desc{c.sat, c.satOld, c.qs, c.qsOld, c.reqs, c.stale, c.avgKV, c.avgQ, c.avgRun,
		c.ready, c.avgKVNew, c.avgQNew, c.avgRunNew, c.readyNew, c.sdKV, c.sdQ, c.sdRun, c.perPod, c.rejects, c.satNow} {
		ch <- d
	}
}

func (c *frontCollector) Collect(ch chan<- prometheus.Metric) {
	p, f := c.p, c.p.front
	pool := p.cfg.Front.Pool
	for _, d := range p.pods {
		c.v.collect(ch, p, d, d.name, pool)
	}
	gauge := func(desc *prometheus.Desc, x float64, labels ...string) {
		ch <- prometheus.MustNewConstMetric(desc, prometheus.GaugeValue, x, labels...)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	for _, stage := range []string{stageDecode, stageEffective} {
		gauge(c.sat, f.saturation, pool, stage)
		gauge(c.satOld, f.saturation, pool, stage)
	}
	for k, n := range f.queued {
		lv := []string{k.fairness, strconv.Itoa(k.priority), pool, k.model, k.model}
		gauge(c.qs, float64(n), lv...)
		gauge(c.qsOld, float64(n), lv...)
	}
	for k, n := range f.outcomes {
		ch <- prometheus.MustNewConstMetric(c.reqs, prometheus.CounterValue, float64(n), k.outcome, strconv.Itoa(k.priority), pool)
	}
	gauge(c.stale, float64(f.stale), f.detectorName())
	if a := f.avg; a.written {
		gauge(c.avgKV, a.kv, pool)
		gauge(c.avgKVNew, a.kv, pool)
		gauge(c.avgQ, a.queue, pool)
		gauge(c.avgQNew, a.queue, pool)
		gauge(c.avgRun, a.running, pool)
		gauge(c.avgRunNew, a.running, pool)
		gauge(c.ready, float64(a.ready), pool)
		gauge(c.readyNew, float64(a.ready), pool)
		gauge(c.sdKV, a.kvSD, pool)
		gauge(c.sdQ, a.queueSD, pool)
		gauge(c.sdRun, a.runSD, pool)
	}
	for i, s := range f.snaps {
		if !s.at.IsZero() {
			gauge(c.perPod, float64(s.waiting), pool, p.pods[i].name)
		}
	}
	for r, n := range f.rejected {
		ch <- prometheus.MustNewConstMetric(c.rejects, prometheus.CounterValue, float64(n), r)
	}
	gauge(c.satNow, f.saturationLocked(time.Now()))
}

func (p *Pool) frontMetricsHandler() (http.Handler, error) {
	reg := prometheus.NewPedanticRegistry()
	if err := reg.Register(newFrontCollector(p)); err != nil {
		return nil, err
	}
	return promhttp.HandlerFor(reg, promhttp.HandlerOpts{ErrorHandling: promhttp.HTTPErrorOnError}), nil
}
