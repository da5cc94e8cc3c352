package openai

import (
	"errors"
	"fmt"
	"net/http"
	"slices"
	"time"

	"github.com/sluice-io/sluice/internal/configtypes"
)

// The request headers the front reads.
const (
	// HeaderQueue names the request queue a call goes onto (one of
	// Config.Queues; Config.DefaultQueue when absent).
	HeaderQueue = "X-Sluice-Queue"
	// HeaderTimeout is the call's timeout, a Go duration ("90s", "5m") or
	// a number of seconds; it becomes the request's deadline. Default
	// Config.DefaultTimeout, at most Config.MaxTimeout.
	HeaderTimeout = "X-Sluice-Timeout"
	// HeaderRequestID is set on every answer: the id the request had on
	// the queue (for `sluice cancel`, traces and logs).
	HeaderRequestID = "X-Sluice-Request-Id"
	// HeaderErrorCode is set on an answer that carries a sluice error
	// code (DEADLINE_EXCEEDED, GATE_DROPPED, …).
	HeaderErrorCode = "X-Sluice-Error-Code"
)

// Config configures the front; it is the openai_api section of a sluice
// config file.
type Config struct {
	// Listen is the address `sluice serve` serves the front on (e.g.
	// "127.0.0.1:8091"). New does not use it.
	Listen string `json:"listen,omitempty"`
	// DefaultQueue is the request queue a call without X-Sluice-Queue goes
	// onto (required).
	DefaultQueue string `json:"default_queue"`
	// Queues are the queues X-Sluice-Queue may name. Default: DefaultQueue
	// alone.
	Queues []string `json:"queues,omitempty"`
	// RoutePrefix starts the name of every call's result route (the rest
	// is the request id). Default "openai-sync:".
	RoutePrefix string `json:"route_prefix,omitempty"`
	// DefaultTimeout is a call's timeout without X-Sluice-Timeout. Default 10m
	// (the OpenAI clients' own default).
	DefaultTimeout configtypes.Duration `json:"default_timeout,omitempty"`
	// MaxTimeout is the largest X-Sluice-Timeout accepted. Default 1h.
	MaxTimeout configtypes.Duration `json:"max_timeout,omitempty"`
	// ResultGrace is how long past a call's deadline the front still waits
	// for the dispatcher's DEADLINE_EXCEEDED result before it answers 504
	// itself. Default 10s.
	ResultGrace configtypes.Duration `json:"result_grace,omitempty"`
	// KeepAlive is how often a streaming call that waits gets an SSE
	// comment; the response headers (200) are sent with the first one.
	// Default 15s.
	KeepAlive configtypes.Duration `json:"keep_alive,omitempty"`
	// MaxBodyBytes is the largest request body accepted. Default 8 MiB.
	MaxBodyBytes int64 `json:"max_body_bytes,omitempty"`
	// ForwardHeaders are request headers copied onto the queued request,
	// which the dispatcher sends to the gateway (e.g.
	// "X-Gateway-Model-Name"). Authorization is never forwarded.
	ForwardHeaders []string `json:"forward_headers,omitempty"`
}

// SetDefaults fills unset fields.
func (c *Config) SetDefaults() {
	if len(c.Queues) == 0 && c.DefaultQueue != "" {
		c.Queues = []string{c.DefaultQueue}
	}
	if c.RoutePrefix == "" {
		c.RoutePrefix = "openai-sync:"
	}
	if c.DefaultTimeout == 0 {
		c.DefaultTimeout = configtypes.Duration(10 * time.Minute)
	}
	if c.MaxTimeout == 0 {
		c.MaxTimeout = configtypes.Duration(time.Hour)
	}
	if c.ResultGrace == 0 {
		c.ResultGrace = configtypes.Duration(10 * time.Second)
	}
	if c.KeepAlive == 0 {
		c.KeepAlive = configtypes.Duration(15 * time.Second)
	}
	if c.MaxBodyBytes == 0 {
		c.MaxBodyBytes = 8 << 20
	}
}

// Validate checks c (after SetDefaults).
func (c Config) Validate() error {
	var errs []error
	if c.DefaultQueue == "" {
		errs = append(errs, errors.New("default_queue is empty"))
	} else if !slices.Contains(c.Queues, c.DefaultQueue) {
		errs = append(errs, fmt.Errorf("queues %q do not include default_queue %q", c.Queues, c.DefaultQueue))
	}
	for _, q := range c.Queues {
		if q == "" {
			errs = append(errs, errors.New("queues holds an empty name"))
		}
	}
	if c.DefaultTimeout.D() <= 0 || c.MaxTimeout.D() <= 0 || c.ResultGrace.D() < 0 || c.KeepAlive.D() <= 0 {
		errs = append(errs, errors.New("default_timeout, max_timeout and keep_alive must be positive, result_grace not negative"))
	}
	if c.DefaultTimeout.D() > c.MaxTimeout.D() {
		errs = append(errs, fmt.Errorf("default_timeout %v is above max_timeout %v", c.DefaultTimeout.D(), c.MaxTimeout.D()))
	}
	if c.MaxBodyBytes < 0 {
		errs = append(errs, fmt.Errorf("max_body_bytes %d is negative", c.MaxBodyBytes))
	}
	for _, h := range c.ForwardHeaders {
		if h == "" || http.CanonicalHeaderKey(h) == "Authorization" {
			errs = append(errs, fmt.Errorf("forward_headers: %q cannot be forwarded", h))
		}
	}
	if err := errors.Join(errs...); err != nil {
		return fmt.Errorf("openai_api: %w", err)
	}
	return nil
}
