package redissortedset_test

import (
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/transport"
	rss "github.com/sluice-io/sluice/transports/redissortedset"
)

func TestClaimOptions(t *testing.T) {
	for _, tc := range []struct {
		name                string
		o                   rss.Options
		lease, hb, interval int
		err                 string
	}{
		{name: "defaults", lease: 15000, hb: 5000, interval: 5000},
		{name: "upstream's lease", o: rss.Options{ClaimLeaseTTLSeconds: 300}, lease: 300000, hb: 30000, interval: 15000},
		{name: "upstream's reclaim interval", o: rss.Options{ClaimReclaimIntervalMS: 15000}, lease: 15000, hb: 5000, interval: 15000},
		{name: "both names agreeing", o: rss.Options{ClaimLeaseTTLSeconds: 30, LeaseMS: 30000}, lease: 30000, hb: 10000, interval: 10000},
		{name: "lease names disagreeing", o: rss.Options{ClaimLeaseTTLSeconds: 30, LeaseMS: 20000}, err: "claim_lease_ttl_seconds 30 and lease_ms 20000 disagree"},
		{name: "negative lease", o: rss.Options{ClaimLeaseTTLSeconds: -1}, err: "claim_lease_ttl_seconds -1 must be non-negative"},
		{name: "negative interval", o: rss.Options{ClaimReclaimIntervalMS: -5}, err: "claim_reclaim_interval_ms -5 must be non-negative"},
		{name: "interval names disagreeing", o: rss.Options{ClaimReclaimIntervalMS: 100, ReclaimIntervalMS: 200}, err: "claim_reclaim_interval_ms 100 and reclaim_interval_ms 200 disagree"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o := tc.o
			o.SetDefaults()
			err := o.Validate()
			if tc.err != "" {
				if err == nil || !strings.Contains(err.Error(), tc.err) {
					t.Fatalf("error %v, want %q", err, tc.err)
				}
				return
			}
			if err != nil {
				t.Fatal(err)
			}
			if o.LeaseMS != tc.lease || o.HeartbeatMS != tc.hb || o.ReclaimIntervalMS != tc.interval {
				t.Errorf("lease %d heartbeat %d reclaim %d, want %d %d %d", o.LeaseMS, o.HeartbeatMS, o.ReclaimIntervalMS, tc.lease, tc.hb, tc.interval)
			}
		})
	}
}

func TestResultTTLValidated(t *testing.T) {
	tp, err := rss.New(rss.Options{Server: rss.Server{URL: "redis://127.0.0.1:1"}}, nil)
	if err != nil {
		t.Fatal(err)
	}
	defer tp.Close()
	q := transport.Queue{Name: "q", ResultName: "r", ResultTTLSeconds: -1}
	if err := tp.CheckQueue(q); err == nil || !strings.Contains(err.Error(), "result_ttl_seconds -1 must not be negative") {
		t.Fatalf("CheckQueue: %v", err)
	}
	if _, err := tp.Source(q); err == nil {
		t.Fatal("Source accepted a negative result_ttl_seconds")
	}
	q.ResultTTLSeconds = 60
	if err := tp.CheckQueue(q); err != nil {
		t.Fatal(err)
	}
}

// prefetch: the queue's concurrency by default (at most the batch
// size), a number as given, -1 none; anything else refused.
func TestPrefetchOption(t *testing.T) {
	for _, tc := range []struct {
		prefetch, concurrency, batch, want int
		err                                string
	}{
		{prefetch: 0, concurrency: 64, want: 64},
		{prefetch: 0, concurrency: 1, want: 1},
		{prefetch: 0, concurrency: 1000, batch: 100, want: 100},
		{prefetch: 8, concurrency: 64, want: 8},
		{prefetch: -1, concurrency: 64, want: 0},
		{prefetch: -2, err: "prefetch -2 must be -1 (none), 0 (the concurrency) or up to 1000"},
		{prefetch: 1001, err: "prefetch 1001 must be"},
	} {
		o := rss.Options{Server: rss.Server{URL: "redis://127.0.0.1:1"}, Prefetch: tc.prefetch, BatchSize: tc.batch}
		o.SetDefaults()
		if err := o.Validate(); tc.err != "" {
			if err == nil || !strings.Contains(err.Error(), tc.err) {
				t.Errorf("prefetch %d: error %v, want %q", tc.prefetch, err, tc.err)
			}
			continue
		} else if err != nil {
			t.Fatalf("prefetch %d: %v", tc.prefetch, err)
		}
		tp, err := rss.New(o, nil)
		if err != nil {
			t.Fatal(err)
		}
		src, err := tp.Source(transport.Queue{Name: "q", ResultName: "r", MaxConcurrency: tc.concurrency})
		if err != nil {
			t.Fatal(err)
		}
		if got := src.(transport.Prefetcher).Prefetch(); got != tc.want {
			t.Errorf("prefetch %d, concurrency %d, batch %d: Prefetch() = %d, want %d", tc.prefetch, tc.concurrency, tc.batch, got, tc.want)
		}
		_ = tp.Close()
	}
}
