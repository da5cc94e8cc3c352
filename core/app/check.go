package app

import (
	"errors"
	"fmt"
	"log/slog"

	"github.com/sluice-io/sluice/core/config"
	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/transport"
)

// Check defaults and validates cfg against the adapters as New does, then
// builds (and closes) what New would build from it with the same steps, so
// that each component checks its own settings with its own defaults: the
// dispatcher, the retry policy, the transport and every queue's gate.
// Factories do no I/O at construction, so Check needs no server. It returns
// the config's problems, or else every component's.
func Check(cfg *config.Config, ad Adapters) error {
	ad.setDefaults()
	cfg.SetDefaults()
	if err := cfg.Validate(ad.known(false)); err != nil {
		return err
	}
	var errs []error
	if c, err := newDispatcher(cfg); err != nil {
		errs = append(errs, err)
	} else {
		if _, err := priority(cfg, c); err != nil {
			errs = append(errs, err)
		}
		c.Close()
	}
	p := retryPolicy(cfg)
	p.SetDefaults()
	if err := p.Validate(); err != nil {
		errs = append(errs, err)
	}
	if tp, err := newTransport(cfg, ad.Transports, nil); err != nil {
		errs = append(errs, fmt.Errorf("transport_config: %w", err))
	} else {
		if qc, ok := tp.(transport.QueueChecker); ok {
			for i, q := range cfg.TransportConfig.Queues {
				if err := qc.CheckQueue(q.Queue); err != nil {
					errs = append(errs, fmt.Errorf("transport_config.queues[%d]: %w", i, err))
				}
			}
		}
		_ = tp.Close()
	}
	for i, q := range cfg.TransportConfig.Queues {
		params, _, err := gateDefinition(q)
		if err == nil {
			err = checkGate(ad, cfg, q, params)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("transport_config.queues[%d].gate_params: %w", i, err))
		}
	}
	for i, wp := range cfg.WorkerPools {
		if wp.GateType == "" {
			continue
		}
		params, err := gate.ParseParams(wp.GateParams)
		if err == nil {
			var g gate.Gate
			env := gateEnv(cfg, wp.Workers)
			env.Pool = wp.ID
			if g, err = ad.Gates.New(wp.GateType, params, env); err == nil {
				if c, ok := g.(interface{ Close() error }); ok {
					_ = c.Close()
				}
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("worker_pools[%d] (%s).gate_params: %w", i, wp.ID, err))
		}
	}
	return errors.Join(errs...)
}

// checkGate builds a queue's gate and closes it again.
func checkGate(ad Adapters, cfg *config.Config, q config.Queue, params gate.Params) error {
	g, err := newGate(ad.Gates, cfg, q, params, slog.New(slog.DiscardHandler), nil) // built to check, not run
	if err != nil {
		return err
	}
	if c, ok := g.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	return nil
}
