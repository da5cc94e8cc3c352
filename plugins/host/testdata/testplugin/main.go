// Command testplugin is a misbehaving gate plugin for plugins/host's tests.
// Its first argument picks the misbehaviour: "hang" (Budget and Admit block
// until their context ends), "exit" (Budget ends the process).
package main

import (
	"context"
	"os"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/sdk"
)

type testGate struct{ mode string }

func (g testGate) Budget(ctx context.Context) (float64, error) {
	switch g.mode {
	case "hang":
		<-ctx.Done()
		return 0, ctx.Err()
	case "exit":
		os.Exit(3)
	}
	return 1, nil
}

func (g testGate) Admit(ctx context.Context, _ *wire.Request) (gate.Decision, error) {
	if g.mode == "hang" {
		<-ctx.Done()
		return gate.Decision{}, ctx.Err()
	}
	return gate.Admitted, nil
}

func main() {
	mode := ""
	if len(os.Args) > 1 {
		mode = os.Args[1]
	}
	sdk.Serve(testGate{mode: mode})
}
