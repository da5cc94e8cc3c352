package constant_test

import (
	"testing"

	"go.uber.org/goleak"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/gatetest"
)

func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }

func TestConformance(t *testing.T) {
	for _, b := range []float64{0, 0.5, 1} {
		gatetest.Run(t, func(t testing.TB) gate.Gate {
			g, err := constant.New(b)
			if err != nil {
				t.Fatal(err)
			}
			return g
		}, gatetest.Features{})
	}
}

func TestFactory(t *testing.T) {
	tests := []struct {
		vals    map[string]string
		wantErr bool
	}{
		{nil, false}, {map[string]string{"budget": "0.25"}, false},
		{map[string]string{"budget": "2"}, true}, {map[string]string{"budget": "x"}, true},
		{map[string]string{"other": "1"}, true},
	}
	for _, tt := range tests {
		if _, err := constant.Factory(gate.NewParams(tt.vals), gate.Env{}); (err != nil) != tt.wantErr {
			t.Errorf("%v: error %v, want error %v", tt.vals, err, tt.wantErr)
		}
	}
}
