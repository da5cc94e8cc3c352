// Package poolsim simulates an inference pool in which batch traffic can
// hurt interactive traffic: P vLLM-V1-like engine pods behind an EPP-like
// front, in one process. `sluice simulate-pool` serves it; benchmarks and
// the demo embed it. (The fixed-delay internal/simulator stays for
// throughput benchmarks.) It imports nothing from sluice's adapters.
//
// # Engine
//
// Each pod runs a step loop modelled on vLLM V1's Scheduler.schedule:
// running requests first, in admission order, each asking for its missing
// tokens (1 for a decode, the rest of its prompt for a prefill, capped by
// LongPrefillThreshold and the step's MaxNumBatchedTokens budget); then, if
// nothing was preempted in the step, waiting requests while there are seats
// (MaxNumSeqs), budget and KV blocks, chunking a prompt larger than the
// budget left. KV is paged (BlockSize tokens a block, KVTokens a pod): a
// running request that cannot get its blocks preempts the last admitted
// (FCFS) or the max by (priority, arrival) (PolicyPriority) until it can;
// the victim's blocks are freed, its computed tokens reset to 0 (it
// recomputes prompt and output so far), and it goes back to the head of the
// waiting queue. A waiting head whose blocks cannot be allocated blocks the
// queue. EngineConfig.SeatPreempt adds what vLLM V1 lacks (open PRs
// #45561/#54530): a waiting head of strictly higher priority preempts the
// lowest-priority running request when every seat is taken. A step lasts
//
//	ITL·(1 + (LoadFactor−1)·(n−1)/(MaxNumSeqs−1)) + PrefillPerToken·p + PrefillOverhead·k
//
// for n sequences, p prompt tokens and k prefills starting, spread by
// ±StepJitter. At its end every sequence that caught up samples a token,
// and one that reached its length frees its blocks. Steps are scheduled on
// absolute deadlines (a step starts when the previous one was due to end),
// so CPU noise does not accumulate; how late each step actually ended is
// the step lag (LagStats, simulator_engine_step_lag_seconds): a run with a
// high step-lag p99 was not kept up with by the machine and should be
// discarded.
//
// # Front
//
// The front reads every pod's gauges each RefreshInterval (the EPP's 50 ms
// scrape); a read older than StalenessThreshold scores the pod 1.0. The
// utilization detector gives each pod max(waiting/QueueDepthThreshold,
// kv/KVCacheUtilThreshold) and the pool their average (uncapped); the
// concurrency detector is the front's in-flight count over
// Pods·MaxConcurrency. Routing picks, among the pods the detector's filter
// keeps (all when it keeps none), the one with the fewest waiting requests
// (its last read plus what the front sent it since), then running, ties at
// random from the seed. Modes: passthrough; legacy-admission (priority < 0
// and saturation ≥ 1 → 429 with x-llm-d-request-dropped-reason:
// rejected-saturated); flow-control (one FIFO band per priority, dispatch
// cycles that stop at the first band whose ceiling the saturation reaches,
// TTL → 503 rejected-ttl-expired, band full → 429).
//
// # HTTP
//
// Handler serves POST /v1/completions and /v1/chat/completions through the
// front, POST /pods/{i}/v1/... straight to pod i, GET /metrics (the EPP's
// series and every pod's vLLM series with pod and inference_pool labels),
// GET /pods/{i}/metrics (one pod, vLLM's labels model_name and engine) and
// GET /healthz. The class comes from X-Sim-Class, else the objective
// header's entry in FrontConfig.Objectives; the prompt length from
// X-Sim-Prompt-Tokens, else ceil(bytes/4) of the prompt text (token arrays
// count one a token); max_tokens (or max_completion_tokens) from the body.
// Answers carry usage and X-Sim-Ttft-Ms, X-Sim-Queue-Ms, X-Sim-Pod and
// X-Sim-Preemptions; streamed answers send one SSE event per token at the
// end of the step that made it, a usage event, then data: [DONE]. A client
// that goes away frees its request.
//
// # Go API
//
// A benchmark or a demo builds the pool and serves it itself:
//
//	pool, err := poolsim.New(cfg)    // cfg.SetDefaults() is applied
//	err = pool.Start(ctx)            // step loops and front, until ctx ends or Close
//	url, err := pool.Listen(addr)    // or mount pool.Handler() anywhere
//	pool.OnRecord(fn)                // before Start: one Record per finished request
//	pool.Saturation()                // what llm_d_epp_flow_control_pool_saturation reads
//	pool.PodGauges()                 // running, waiting, KV usage per pod, by class
//	pool.Stats(), pool.ResetStats()  // per-class counts, rejections, step lag
//	pool.StepLag()                   // LagStats: the run's validity
//	pool.Sample()                    // a cheap timeline point: gauges and cumulative counts by class
//	pool.SetPodStalled(i, true)      // the front's reads of pod i fail
//	defer pool.Close()
//
// An in-process gate (the demo's, with no Prometheus) reads Saturation and
// PodGauges directly. Replay runs the same engines and routing on a virtual
// clock, deterministically given Config.Seed, for tests and for computing a
// load's uncontended timings without waiting for them.
package poolsim
