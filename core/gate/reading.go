package gate

import "sync"

// Reading is what a metric gate last read from its source, exported as
// upstream's async_gate_metric_value, _threshold and _source_available
// gauges. A metric gate's budget is 0 when Value ≤ Threshold, else
// min(1, Value − Threshold).
type Reading struct {
	// Pool is the inference pool the reading is about (the inference_pool label).
	Pool string
	// Value is the last usable reading (for a saturation gate, 1 − saturation).
	Value float64
	// Threshold is what Value is compared with (for a saturation gate,
	// 1 − threshold; for a free-share gate, its baseline).
	Threshold float64
	// Read is true once a usable reading was taken; Value and Threshold
	// mean nothing before.
	Read bool
	// Available is false when the last evaluation fell back (query failed,
	// no sample, NaN); Value and Threshold then keep their last usable values.
	Available bool
}

// Reader is implemented by gates that read a metric: Readings returns the
// latest reading of each source, none before the first evaluation.
type Reader interface {
	Readings() []Reading
}

// ReadingsOf returns g's readings, looking through wrappers (a gate with an
// Unwrap() Gate method), or nil when g reads no metric.
func ReadingsOf(g Gate) []Reading {
	if r, ok := Find[Reader](g); ok {
		return r.Readings()
	}
	return nil
}

// ReadingRecorder keeps a metric gate's latest reading; a gate embeds one
// and calls Record or Fail at each evaluation. It is safe for concurrent use.
type ReadingRecorder struct {
	mu        sync.Mutex
	r         Reading
	evaluated bool
}

// Record stores a usable reading of pool.
func (rr *ReadingRecorder) Record(pool string, value, threshold float64) {
	rr.mu.Lock()
	rr.r = Reading{Pool: pool, Value: value, Threshold: threshold, Read: true, Available: true}
	rr.evaluated = true
	rr.mu.Unlock()
}

// Fail records an evaluation of pool without a usable reading: the last
// value and threshold are kept.
func (rr *ReadingRecorder) Fail(pool string) {
	rr.mu.Lock()
	rr.r.Pool, rr.r.Available = pool, false
	rr.evaluated = true
	rr.mu.Unlock()
}

// Readings returns the latest reading, none before the first evaluation.
func (rr *ReadingRecorder) Readings() []Reading {
	rr.mu.Lock()
	defer rr.mu.Unlock()
	if !rr.evaluated {
		return nil
	}
	return []Reading{rr.r}
}
