package app

import (
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/redisbudget"
)

// registerMore registers the transports and gates beyond the embedded
// defaults. Each adapter package is added here, explicitly.
func registerMore(tr *transport.Registry, gr *gate.Registry) {
	_ = tr
	must(gr.Register(redisbudget.Type, redisbudget.Factory))
}
