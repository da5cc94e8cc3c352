package main

import (
	"errors"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/endpointscrape"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/gates/redisbudget"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/memory"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redissortedset"
	"github.com/sluice-io/sluice/transports/redisstream"
)

// adapters registers the transports and gates the scenarios run on, as any
// program embedding sluice does (the memory-only scenarios go through
// cmd/sluice/demo, which registers its own).
func adapters() (app.Adapters, error) {
	ad := app.NewAdapters()
	err := errors.Join(
		ad.Transports.Register(memory.Name, memory.Factory),
		ad.Transports.Register(redissortedset.Name, redissortedset.Factory),
		ad.Transports.Register(redispubsub.Name, redispubsub.Factory),
		ad.Transports.Register(redisstream.Name, redisstream.Factory),
		ad.Transports.Register(gcppubsub.Name, gcppubsub.Factory),
		ad.Gates.Register(constant.Type, constant.Factory),
		ad.Gates.Register(aimd.Type, aimd.Factory),
		ad.Gates.Register(promsaturation.Type, promsaturation.Factory),
		ad.Gates.Register(prombudget.Type, prombudget.Factory),
		ad.Gates.Register(endpointscrape.Type, endpointscrape.Factory),
		ad.Gates.Register(headroom.Type, headroom.Factory),
		ad.Gates.Register(redisbudget.Type, redisbudget.Factory),
		ad.Gates.Register(redisquota.Type, redisquota.NewFactory()),
	)
	return ad, err
}

// newApp assembles a deployment of cfg over the bench's adapters.
func newApp(cfg *config.Config, o app.Options) (*app.App, error) {
	ad, err := adapters()
	if err != nil {
		return nil, err
	}
	o.Adapters = ad
	return app.New(cfg, o)
}
