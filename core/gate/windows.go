package gate

// Window is one congestion window of a feedback gate (aimd keeps one per
// band).
type Window struct {
	// Band names the window ("overflow-batch").
	Band string
	// Size is the window: how many of the band's requests may be in flight.
	Size float64
	// SSThresh is its slow-start threshold (Size below it: slow start).
	SSThresh float64
	// InFlight is how many requests the window holds now.
	InFlight int
	// Closed says the band is closed (a Retry-After).
	Closed bool
}

// WindowReporter is implemented by feedback gates; their windows are
// exported as sluice_gate_window{gate, band} and its _ssthresh, _inflight
// and _closed companions. Windows must be cheap and safe for concurrent
// use: it is read at every scrape.
type WindowReporter interface {
	Windows() []Window
}

// WindowsOf returns g's window reporter, looking through wrappers, or nil.
func WindowsOf(g Gate) WindowReporter {
	for g != nil {
		if wr, ok := g.(WindowReporter); ok {
			return wr
		}
		u, ok := g.(interface{ Unwrap() Gate })
		if !ok {
			return nil
		}
		g = u.Unwrap()
	}
	return nil
}
