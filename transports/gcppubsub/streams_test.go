package gcppubsub

import (
	"strings"
	"testing"
)

// The number of streaming pulls follows the queue's max concurrency unless
// num_streams sets it; out-of-range settings are refused.
func TestStreams(t *testing.T) {
	tests := []struct {
		numStreams, maxConcurrency, want int
	}{
		{0, 0, 1},
		{0, 1, 1},
		{0, 8, 1},
		{0, 9, 2},
		{0, 64, 8},
		{0, 100, 13},
		{0, 5000, 16},
		{3, 5000, 3},
		{40, 1, 40},
	}
	for _, tt := range tests {
		o := Options{NumStreams: tt.numStreams}
		if got := o.streams(tt.maxConcurrency); got != tt.want {
			t.Errorf("num_streams %d, max concurrency %d: %d streams, want %d", tt.numStreams, tt.maxConcurrency, got, tt.want)
		}
	}
	for _, n := range []int{-1, maxStreams + 1} {
		o := Options{ProjectID: "p", NumStreams: n}
		o.setDefaults()
		if err := o.Validate(); err == nil || !strings.Contains(err.Error(), "num_streams") {
			t.Errorf("num_streams %d: %v, want an error naming num_streams", n, err)
		}
	}
}
