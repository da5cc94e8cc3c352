package promquery

import (
	"math"
	"testing"
)

func TestSelector(t *testing.T) {
	tests := []struct {
		metric string
		labels []string
		want   string
	}{
		{"m", nil, "m{}"},
		{"m", []string{"a", "x"}, `m{a="x"}`},
		{"m", []string{"a", "x", "ns", ""}, `m{a="x"}`},
		{"vllm:x", []string{"a", `q"uo\te`, "b", "y"}, `vllm:x{a="q\"uo\\te",b="y"}`},
	}
	for _, tt := range tests {
		if got := Selector(tt.metric, tt.labels...); got != tt.want {
			t.Errorf("Selector(%q, %q) = %s, want %s", tt.metric, tt.labels, got, tt.want)
		}
	}
}

func TestMax(t *testing.T) {
	tests := []struct {
		vals []float64
		want float64
		ok   bool
	}{
		{nil, 0, false}, {[]float64{math.NaN()}, 0, false}, {[]float64{0.2, math.NaN(), 0.7}, 0.7, true},
		{[]float64{-1}, -1, true}, {[]float64{math.Inf(-1)}, math.Inf(-1), true},
	}
	for _, tt := range tests {
		got, ok := Max(tt.vals)
		if ok != tt.ok || (ok && got != tt.want) {
			t.Errorf("Max(%v) = %v, %v; want %v, %v", tt.vals, got, ok, tt.want, tt.ok)
		}
	}
}

func TestConfigValidate(t *testing.T) {
	for url, ok := range map[string]bool{
		"http://prom:9090": true, "https://prom/sub/path": true, "": false, "prom:9090": false, "ftp://x": false,
	} {
		if err := (Config{URL: url}).Validate(); (err == nil) != ok {
			t.Errorf("Validate(%q) = %v, want ok %v", url, err, ok)
		}
	}
}
