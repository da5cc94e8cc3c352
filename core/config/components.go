package config

import (
	"fmt"
	"strings"

	"github.com/sluice-io/sluice/core/dispatch"
	"github.com/sluice-io/sluice/core/pipeline"
)

// The parts of a config that components read, in the components' own
// types. Fields the config leaves zero take the component's defaults (its
// SetDefaults), and Validate runs the component's own checks on them, so a
// rule lives once, in the component.

// RetryPolicy is the retry middleware's part of c.
func (c *Config) RetryPolicy() pipeline.RetryPolicy {
	return pipeline.RetryPolicy{Base: c.Retry.Base.D(), Max: c.Retry.Max.D(), Jitter: c.Retry.Jitter, MaxAttempts: c.Retry.MaxAttempts}
}

// DispatchConfig is the HTTP client's part of c; the error is a merge
// policy whose fairness parameters do not read.
func (c *Config) DispatchConfig() (dispatch.Config, error) {
	fair, err := dispatch.ParseFairness(c.MergePolicy.Parameters)
	if err != nil {
		return dispatch.Config{}, fmt.Errorf("merge_policy: %w", err)
	}
	return dispatch.Config{
		Fairness:         fair,
		MaxConns:         c.maxConcurrency(),
		RequestTimeout:   c.RequestTimeout.D(),
		DeadlineHeader:   c.Dispatch.DeadlineHeader,
		TimeoutHeader:    c.Dispatch.TimeoutHeader,
		MaxResponseBytes: c.Dispatch.MaxResponseBytes,
		Protocol:         c.Dispatch.Protocol,
		TLS: dispatch.TLSConfig{CACert: c.TLS.CACert, Cert: c.TLS.Cert, Key: c.TLS.Key,
			InsecureSkipVerify: c.TLS.InsecureSkipVerify},
	}, nil
}

// maxConcurrency is the most requests in flight at once over all queues,
// at least the config's concurrency: the idle connections kept per gateway.
func (c *Config) maxConcurrency() int {
	n := 0
	for _, p := range c.WorkerPools {
		n += p.Workers
	}
	return max(n, c.Concurrency)
}

// componentProblems runs the components' own checks on their parts of c,
// with their defaults applied, and adds what they refuse.
func (c *Config) componentProblems(add func(where, format string, a ...any)) {
	p := c.RetryPolicy()
	p.SetDefaults()
	if err := p.Validate(); err != nil {
		add("retry", "%s", strings.TrimPrefix(err.Error(), "retry: "))
	}
	if c.MergePolicy.check() != nil {
		return // Validate reports it
	}
	dc, err := c.DispatchConfig()
	if err != nil {
		add("merge_policy", "%s", strings.TrimPrefix(err.Error(), "merge_policy: "))
		return
	}
	dc.SetDefaults()
	dc.MaxConns = max(dc.MaxConns, 0) // from concurrency, which is reported itself
	for _, err := range each(dc.Validate()) {
		add("dispatch", "%s", strings.TrimPrefix(err.Error(), "dispatch: "))
	}
}

// each returns the errors err joins (errors.Join), or err alone.
func each(err error) []error {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		return j.Unwrap()
	}
	if err == nil {
		return nil
	}
	return []error{err}
}
