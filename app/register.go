package app

import (
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
)

// registerMore registers the transports and gates beyond the embedded
// defaults. Each adapter package is added here, explicitly.
func registerMore(tr *transport.Registry, gr *gate.Registry) {
	_, _ = tr, gr
}
