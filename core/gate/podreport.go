package gate

// PodReporter is implemented by gates that place requests on pods
// (Decision.Pod) and can tell, per pod, what their last reading saw: how
// many of their calls run there and how many they allow. The pipeline's
// evictor asks it after each measured budget and takes back, on each pod
// over its Limit, the youngest calls there (without it, the queue's
// youngest wherever they run); the status page (core/status) asks it once
// a second from the refresh loop's goroutine, right after Budget, and
// whenever the page is read. It must be cheap and safe for concurrent use.
type PodReporter interface {
	// PodReadings returns each pod's figures of the last reading, in a
	// stable order, or nil when the gate does not place requests (or has
	// not read the pods yet). The caller may keep the slice.
	PodReadings() []PodReading
}

// PodReading is one pod's figures of a gate's last reading.
type PodReading struct {
	// Pod is the pod's base URL (Decision.Pod's).
	Pod string
	// InFlight is the gate's calls on the pod (the batch it holds there);
	// Limit is the most it allows there now: the evictor takes back the
	// calls over it.
	InFlight, Limit int
	// Running and Waiting are the pod's own gauges (all traffic).
	Running, Waiting int
	// KV is the pod's KV-cache usage in [0,1] (0 when not read).
	KV float64
	// Burst is set while the gate sees a burst of other traffic there.
	Burst bool
}

// PodReporterOf returns g's pod reporter, looking through wrappers, or nil.
func PodReporterOf(g Gate) PodReporter {
	r, _ := Find[PodReporter](g)
	return r
}
