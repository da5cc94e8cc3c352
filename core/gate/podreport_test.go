package gate

import "testing"

// reportingGate is a gate that reports its per-pod readings.
type reportingGate struct{ fixedGate }

func (reportingGate) PodReadings() []PodReading {
	return []PodReading{{Pod: "http://pod-0", InFlight: 2, Limit: 5}}
}

// PodReporterOf finds the per-pod reporter under the registry's wrapper,
// and nothing on a gate without one.
func TestPodReporterOf(t *testing.T) {
	wrapped := wrapConfigured(reportingGate{fixedGate(1)}, FailOpen, 0)
	if _, direct := wrapped.(PodReporter); direct {
		t.Fatal("the wrapper itself is a PodReporter: the case tests nothing")
	}
	r := PodReporterOf(wrapped)
	if r == nil {
		t.Fatal("PodReporterOf did not look through the wrapper")
	}
	if got := r.PodReadings(); len(got) != 1 || got[0].Pod != "http://pod-0" || got[0].InFlight != 2 || got[0].Limit != 5 {
		t.Errorf("readings %+v", got)
	}
	if PodReporterOf(wrapConfigured(fixedGate(1), FailOpen, 0)) != nil || PodReporterOf(nil) != nil {
		t.Error("PodReporterOf found a reporter on a gate that has none")
	}
}
