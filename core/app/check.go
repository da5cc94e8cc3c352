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
// dispatcher (its files), the transport and every gate, which is also asked
// what it can tell without its backend (gate.Validator: a missing plugin
// binary, for instance). cfg.Validate ran the retry policy's and the
// dispatcher's own checks. Factories do no I/O at construction, so Check
// needs no server. It returns every problem it found: the config's, and the
// components' that the config's problems leave buildable (a known
// transport, a known gate type).
func Check(cfg *config.Config, ad Adapters) error {
	_, err := CheckWarnings(cfg, ad)
	return err
}

// CheckWarnings is Check, also returning the warnings: the settings
// upstream accepts that act on nothing here (config.Warnings, which New
// logs), then what the transport says of queues that work but not as their user
// may expect (transport.QueueWarner), one line each, prefixed with where
// the queue is.
func CheckWarnings(cfg *config.Config, ad Adapters) ([]string, error) {
	ad.setDefaults()
	cfg.SetDefaults()
	var errs []error
	warnings := cfg.Warnings()
	k := ad.known(false)
	cfgErr := cfg.Validate(k)
	if cfgErr != nil {
		errs = append(errs, cfgErr)
	} else if c, err := newDispatcher(cfg); err != nil {
		errs = append(errs, err)
	} else {
		if _, err := priority(cfg, c); err != nil {
			errs = append(errs, err)
		}
		c.Close()
	}
	if k.Transport(cfg.Transport) {
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
			if qw, ok := tp.(transport.QueueWarner); ok {
				for i, q := range cfg.TransportConfig.Queues {
					for _, w := range qw.QueueWarnings(q.Queue) {
						warnings = append(warnings, fmt.Sprintf("transport_config.queues[%d]: %s", i, w))
					}
				}
			}
			_ = tp.Close()
		}
	}
	for i, q := range cfg.TransportConfig.Queues {
		if !k.Gate(q.GateType) {
			continue // the config's problem
		}
		params, _, err := gateDefinition(q)
		if err == nil {
			err = checkGate(ad, cfg, q, params)
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("transport_config.queues[%d].gate_params: %w", i, err))
		}
	}
	for i, wp := range cfg.WorkerPools {
		if wp.GateType == "" || !k.Gate(wp.GateType) {
			continue
		}
		params, err := gate.ParseParams(wp.GateParams)
		if err == nil {
			var g gate.Gate
			env := gateEnv(cfg, wp.Workers)
			env.Pool = wp.ID
			if g, err = ad.Gates.New(wp.GateType, params, env); err == nil {
				err = validateAndClose(g)
			}
		}
		if err != nil {
			errs = append(errs, fmt.Errorf("worker_pools[%d] (%s).gate_params: %w", i, wp.ID, err))
		}
	}
	return warnings, errors.Join(errs...)
}

// checkGate builds a queue's gate, asks what it can tell without its
// backend, and closes it again.
func checkGate(ad Adapters, cfg *config.Config, q config.Queue, params gate.Params) error {
	g, _, err := newGate(ad.Gates, cfg, q, params, slog.New(slog.DiscardHandler), nil, "") // built to check, not run: no metrics
	if err != nil {
		return err
	}
	return validateAndClose(g)
}

// validateAndClose returns what g's Validator reports, closing g.
func validateAndClose(g gate.Gate) error {
	err := gate.ValidateGate(g)
	if c, ok := g.(interface{ Close() error }); ok {
		_ = c.Close()
	}
	return err
}
