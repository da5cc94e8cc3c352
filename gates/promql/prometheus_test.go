package promql_test

import (
	"context"
	"errors"
	"math"
	"strconv"
	"testing"
	"time"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/gatetest"
	"github.com/sluice-io/sluice/internal/testenv"
)

const saturation = "inference_extension_flow_control_pool_saturation"

// TestRealPrometheus runs upstream's example pool query against a real
// prometheus scraping a fake endpoint picker: the budget follows the
// saturation, a metric that goes away and a query Prometheus refuses give
// the fallback, and the reading is recorded.
func TestRealPrometheus(t *testing.T) {
	epp := testenv.StartGauges(t)
	epp.Set(saturation, 0, "inference_pool", "p")
	prom := testenv.StartPrometheusWith(t, testenv.PrometheusOptions{
		ScrapeInterval: 200 * time.Millisecond,
		Targets:        []testenv.ScrapeTarget{{URL: epp.URL()}},
	})
	env := gate.Env{PrometheusURL: prom.URL, PrometheusCacheTTL: 50 * time.Millisecond}
	q := `clamp(1 - ` + saturation + `{inference_pool="p"} / 0.5, 0, 1)`
	g := mustBuild(t, `{"query":`+strconv.Quote(q)+`,"pool":"p","fallback":0.3}`, env)
	r := gate.NewRefresher(g, gate.RefresherConfig{Name: "query", Interval: 50 * time.Millisecond})
	r.Start(context.Background())
	defer r.Close()

	for _, s := range []struct{ sat, want float64 }{{0, 1}, {0.1, 0.8}, {0.25, 0.5}, {0.5, 0}, {0.9, 0}, {0.05, 0.9}} {
		epp.Set(saturation, s.sat, "inference_pool", "p")
		waitBudget(t, r, s.want, "saturation "+strconv.FormatFloat(s.sat, 'g', -1, 64))
	}
	rd := gate.ReadingsOf(g)
	if len(rd) != 1 || !rd[0].Available || rd[0].Pool != "p" || math.Abs(rd[0].Value-0.9) > 1e-9 || rd[0].Threshold != 0 {
		t.Fatalf("readings %+v; want 0.9 against 0 on pool p", rd)
	}

	// The endpoint stops exporting the series: Prometheus marks it stale at
	// the next scrape, the query returns nothing, the fallback applies.
	epp.Delete(saturation, "inference_pool", "p")
	waitBudget(t, r, 0.3, "metric gone (fallback)")
	if rd := gate.ReadingsOf(g); len(rd) != 1 || rd[0].Available {
		t.Fatalf("readings %+v; want unavailable", rd)
	}

	// A query Prometheus rejects is a failure too.
	bad := mustBuild(t, `{"query":"sum(","fallback":0.7}`, env)
	_, err := gatetest.Query(t, bad)
	var fb *gate.FallbackError
	if !errors.As(err, &fb) || fb.Budget != 0.7 {
		t.Fatalf("bad PromQL: %v; want the fallback 0.7", err)
	}
}

func waitBudget(t *testing.T, r *gate.Refresher, want float64, what string) {
	t.Helper()
	deadline := time.Now().Add(15 * time.Second)
	for math.Abs(r.Budget()-want) > 1e-9 {
		if time.Now().After(deadline) {
			t.Fatalf("%s: budget %v, want %v", what, r.Budget(), want)
		}
		time.Sleep(20 * time.Millisecond)
	}
}
