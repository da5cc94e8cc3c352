package poolsim

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"slices"
	"testing"
	"time"
)

func TestWavesSchedule(t *testing.T) {
	w := Waves{Warmup: 2 * time.Second, Burst: 20 * time.Second, Idle: 20 * time.Second, Cycles: 3, BurstRate: 10, IdleRate: 1, Seed: 7}
	if err := w.Validate(); err != nil {
		t.Fatal(err)
	}
	a, bursts := w.Schedule()
	b, _ := w.Schedule()
	if !slices.Equal(a, b) {
		t.Fatal("the same seed gave two schedules")
	}
	if !slices.IsSorted(a) || a[len(a)-1] >= w.Length() {
		t.Fatalf("arrivals not ascending within the schedule (last %s of %s)", a[len(a)-1], w.Length())
	}
	if len(bursts) != 3 || bursts[0] != [2]time.Duration{2 * time.Second, 22 * time.Second} {
		t.Fatalf("bursts %v", bursts)
	}
	var in, out int
	for _, x := range a {
		if InBurst(bursts, x) {
			in++
		} else {
			out++
		}
	}
	// 3 × 20 s at 10/s and (2 + 3 × 20) s at 1/s: 600 and 62 expected; a
	// Poisson count is within 4 standard deviations of its mean.
	if in < 500 || in > 700 || out < 30 || out > 95 {
		t.Fatalf("%d arrivals in bursts (want about 600), %d outside (want about 62)", in, out)
	}
	if c, _ := (Waves{Seed: 8, Warmup: w.Warmup, Burst: w.Burst, Idle: w.Idle, Cycles: 3, BurstRate: 10, IdleRate: 1}).Schedule(); slices.Equal(a, c) {
		t.Fatal("two seeds gave the same schedule")
	}
	if err := (Waves{Burst: time.Second, Cycles: 0, BurstRate: 1, IdleRate: 1}).Validate(); err == nil {
		t.Fatal("zero cycles validated")
	}
}

func TestClientDriveCountsFailures(t *testing.T) {
	var calls int
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls++
		if r.Header.Get("X-Gateway-Inference-Objective") != "interactive-default" {
			http.Error(w, "no objective", http.StatusBadRequest)
			return
		}
		if calls == 2 {
			http.Error(w, "busy", http.StatusTooManyRequests)
			return
		}
		if calls == 3 {
			_, _ = w.Write([]byte("data: {}\n\n")) // ends without [DONE]
			return
		}
		_, _ = w.Write([]byte("data: {}\n\ndata: [DONE]\n\n"))
	}))
	defer srv.Close()
	c := &Client{Front: srv.URL, PromptTokens: 4, MaxTokens: 2}
	arrivals := []time.Duration{0, 10 * time.Millisecond, 20 * time.Millisecond, 30 * time.Millisecond}
	if got := c.Drive(context.Background(), time.Now(), arrivals); got != 2 {
		t.Fatalf("Drive counted %d failures, want 2 (a 429 and a stream without [DONE])", got)
	}
}

func TestTextPromptFor(t *testing.T) {
	var a, b string
	if err := json.Unmarshal([]byte(TextPromptFor(512, 7)), &a); err != nil {
		t.Fatal(err)
	}
	if err := json.Unmarshal([]byte(TextPromptFor(512, 7+26*26)), &b); err != nil {
		t.Fatal(err)
	}
	if len(a) != 4*512 || len(b) != len(a) {
		t.Fatalf("lengths %d and %d, want %d (512 tokens of 4 bytes)", len(a), len(b), 4*512)
	}
	if n := commonPrefix(a, b); n >= 16*4 {
		t.Fatalf("two ids share %d bytes, want less than one KV block (64)", n)
	}
	if again := TextPromptFor(512, 7); again != `"`+a+`"` {
		t.Fatal("the same id gave two prompts")
	}
}
