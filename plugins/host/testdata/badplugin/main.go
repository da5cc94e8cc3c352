// Command badplugin is a gate plugin for the tests of `sluice plugin test`
// and host.Probe. Its first argument picks what it does:
//
//	budget-only  budget 0.5, no Admit, no Configure (a well-behaved plugin)
//	nan          Budget answers NaN
//	over         Budget answers 1.5
//	admit-hangs  Admit blocks until its context ends; Budget answers 1
//	accept-all   Configure accepts any parameter, even unknown ones
package main

import (
	"context"
	"math"
	"os"

	"github.com/sluice-io/sluice/plugins/sdk"
)

type budgetOnly struct{}

func (budgetOnly) Budget(context.Context) (float64, error) { return 0.5, nil }

type bad struct{ mode string }

func (g bad) Budget(context.Context) (float64, error) {
	switch g.mode {
	case "nan":
		return math.NaN(), nil
	case "over":
		return 1.5, nil
	}
	return 1, nil
}

func (g bad) Admit(ctx context.Context, _ *sdk.Request) (sdk.Decision, error) {
	if g.mode == "admit-hangs" {
		<-ctx.Done()
		return sdk.Decision{}, ctx.Err()
	}
	return sdk.Admitted, nil
}

// acceptAll reads no parameter but marks every one as read.
type acceptAll struct{ bad }

func (acceptAll) Configure(p sdk.Params) error {
	for _, k := range p.Keys() {
		_ = p.String(k, "")
	}
	return nil
}

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	switch mode {
	case "budget-only":
		sdk.Serve(budgetOnly{})
	case "accept-all":
		sdk.Serve(acceptAll{})
	default:
		sdk.Serve(bad{mode: mode})
	}
}
