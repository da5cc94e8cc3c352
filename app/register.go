package app

import (
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/gates/redisbudget"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// registerMore registers the transports and gates beyond the embedded
// defaults. Each adapter package is added here, explicitly.
func registerMore(tr *transport.Registry, gr *gate.Registry) {
	_ = tr
	must(tr.Register(redissortedset.Name, redissortedset.Factory))
	must(tr.Register(redispubsub.Name, redispubsub.Factory))
	must(tr.Register(redisstream.Name, redisstream.Factory))
	must(tr.Register(gcppubsub.Name, gcppubsub.Factory))
	must(gr.Register(redisbudget.Type, redisbudget.Factory))
	must(gr.Register(promsaturation.Type, promsaturation.Factory))
	must(gr.Register(prombudget.Type, prombudget.Factory))
	must(gr.Register(composite.Type, composite.Factory))
	must(gr.Register(host.Type, host.Factory))
}
