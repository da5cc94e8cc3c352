package gate

// CallStats are the timings of one kind of call a gate makes outside
// sluice (a plugin gate: one RPC), since the gate was built.
type CallStats struct {
	// Call names the call ("budget", "admit", ...).
	Call string
	// Count is how many calls ended; Failures how many of them failed.
	Count, Failures uint64
	// Seconds is the total time they took.
	Seconds float64
	// Buckets maps an upper bound, in seconds, to the number of calls that
	// took at most that long (cumulative, as Prometheus histograms count).
	Buckets map[float64]uint64
}

// CallReporter is implemented by gates that time the calls they make (a
// plugin gate: its RPCs to the plugin process); they are exported as
// sluice_gate_plugin_call_seconds{gate, rpc} and
// sluice_gate_plugin_call_failures_total{gate, rpc}. Calls must be cheap
// and safe for concurrent use: it is read at every scrape.
type CallReporter interface {
	Calls() []CallStats
}

// CallsOf returns g's call reporter, looking through wrappers, or nil.
func CallsOf(g Gate) CallReporter {
	for g != nil {
		if cr, ok := g.(CallReporter); ok {
			return cr
		}
		u, ok := g.(interface{ Unwrap() Gate })
		if !ok {
			return nil
		}
		g = u.Unwrap()
	}
	return nil
}
