package exposition

import (
	"strings"
	"testing"
)

// Count sums the sample counts of the histograms (and summaries) whose
// labels match, and says when none does; gauges do not count.
func TestCount(t *testing.T) {
	page := `# TYPE steps histogram
steps_bucket{pod="a",le="+Inf"} 7
steps_sum{pod="a"} 70
steps_count{pod="a"} 7
steps_bucket{pod="b",le="+Inf"} 5
steps_sum{pod="b"} 50
steps_count{pod="b"} 5
# TYPE lat summary
lat{quantile="0.5"} 1
lat_sum 9
lat_count 3
# TYPE running gauge
running 4
`
	fams, err := Parse(strings.NewReader(page))
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		name    string
		filters map[string]string
		want    float64
		ok      bool
	}{
		{"steps", nil, 12, true},
		{"steps", map[string]string{"pod": "b"}, 5, true},
		{"steps", map[string]string{"pod": "c"}, 0, false},
		{"lat", nil, 3, true},
		{"running", nil, 0, false},
		{"absent", nil, 0, false},
	} {
		if n, ok := Count(fams[c.name], c.filters); n != c.want || ok != c.ok {
			t.Errorf("Count(%s, %v) = %v, %v; want %v, %v", c.name, c.filters, n, ok, c.want, c.ok)
		}
	}
}
