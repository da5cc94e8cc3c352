package message

import (
	"encoding/json"
	"testing"
)

type baseWire struct {
	ID       string            `json:"id"`
	Created  float64           `json:"created"`
	Deadline float64           `json:"deadline"`
	Payload  json.RawMessage   `json:"payload"`
	Metadata map[string]string `json:"metadata"`
	Headers  map[string]string `json:"headers"`
	Endpoint string            `json:"endpoint"`
}

func BenchmarkBaseline(b *testing.B) {
	msg := []byte(benchFlat)
	b.ReportAllocs()
	for b.Loop() {
		var w baseWire
		if err := json.Unmarshal(msg, &w); err != nil {
			b.Fatal(err)
		}
	}
}
func BenchmarkValid(b *testing.B) {
	msg := []byte(benchFlat)
	b.ReportAllocs()
	for b.Loop() {
		json.Valid(msg)
	}
}
