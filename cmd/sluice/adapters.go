package main

import (
	"errors"

	"github.com/sluice-io/sluice/core/app"
	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transform/gcsmultipart"
	"github.com/sluice-io/sluice/gates/aimd"
	"github.com/sluice-io/sluice/gates/composite"
	"github.com/sluice-io/sluice/gates/constant"
	"github.com/sluice-io/sluice/gates/endpointscrape"
	"github.com/sluice-io/sluice/gates/headroom"
	"github.com/sluice-io/sluice/gates/localconcurrency"
	"github.com/sluice-io/sluice/gates/prombudget"
	"github.com/sluice-io/sluice/gates/promql"
	"github.com/sluice-io/sluice/gates/promsaturation"
	"github.com/sluice-io/sluice/gates/redisbudget"
	"github.com/sluice-io/sluice/gates/redisleasedrate"
	"github.com/sluice-io/sluice/gates/redisquota"
	"github.com/sluice-io/sluice/gates/tieradmission"
	"github.com/sluice-io/sluice/gates/waitonrefuse"
	"github.com/sluice-io/sluice/plugins/host"
	"github.com/sluice-io/sluice/transports/gcppubsub"
	"github.com/sluice-io/sluice/transports/memory"
	"github.com/sluice-io/sluice/transports/redispubsub"
	"github.com/sluice-io/sluice/transports/redissortedset"
	rssproducer "github.com/sluice-io/sluice/transports/redissortedset/producer"
	"github.com/sluice-io/sluice/transports/redisstream"
	"github.com/sluice-io/sluice/transports/wmtransport"
	"github.com/sluice-io/sluice/transports/wmtransport/natsjetstream"
	"github.com/sluice-io/sluice/transports/wmtransport/postgres"
)

// adapters chooses the transports and gates the sluice binary links: the one
// place they are named. Add an adapter by adding its line here (a
// transport with a producer side, which the fronts run on, adds a second
// line: its submit.Factory under its name).
func adapters() (app.Adapters, error) {
	ad := app.NewAdapters()
	brokers := wmtransport.NewBrokers() // the Watermill brokers of transport "watermill"
	err := errors.Join(
		brokers.Register(natsjetstream.Name, natsjetstream.Factory),
		brokers.Register(postgres.Name, postgres.Factory),
		ad.Transports.Register(wmtransport.Name, wmtransport.Factory(brokers)),

		ad.Transports.Register(memory.Name, memory.Factory),
		ad.Producers.Register(memory.Name, submit.Factory{New: memory.OpenProducer}),
		ad.Transports.Register(redissortedset.Name, redissortedset.Factory),
		ad.Producers.Register(redissortedset.Name, submit.Factory{New: rssproducer.OpenSubmitter}),
		ad.Transports.Register(redispubsub.Name, redispubsub.Factory),
		ad.Transports.Register(redisstream.Name, redisstream.Factory),
		ad.Producers.Register(redisstream.Name, submit.Factory{New: redisstream.OpenProducer, Check: redisstream.CheckProducerOptions}),
		ad.Transports.Register(gcppubsub.Name, gcppubsub.Factory),

		ad.Gates.Register(constant.Type, constant.Factory),
		ad.Gates.Register(redisbudget.Type, redisbudget.Factory),
		ad.Gates.Register(redisleasedrate.Type, redisleasedrate.Factory),
		ad.Gates.Register(redisquota.Type, redisquota.NewFactory()),
		ad.Gates.Register(promsaturation.Type, promsaturation.Factory),
		ad.Gates.Register(prombudget.Type, prombudget.Factory),
		ad.Gates.Register(composite.Type, composite.Factory),
		ad.Gates.Register(localconcurrency.Type, localconcurrency.Factory),
		ad.Gates.Register(waitonrefuse.Type, waitonrefuse.Factory),
		ad.Gates.Register(tieradmission.Type, tieradmission.Factory),
		ad.Gates.Register(promql.Type, promql.Factory),
		ad.Gates.Register(endpointscrape.Type, endpointscrape.Factory),
		ad.Gates.Register(headroom.Type, headroom.Factory),
		ad.Gates.Register(aimd.Type, aimd.Factory),
		ad.Gates.Register(host.Type, host.Factory),

		ad.Transforms.Register(gcsmultipart.Type, gcsmultipart.Factory),
	)
	return ad, err
}
