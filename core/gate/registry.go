package gate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/sluice-io/sluice/core/registry"
)

// Env is what a gate factory may need beyond its own parameters: settings
// shared by every gate of a deployment.
type Env struct {
	// PrometheusURL is --prometheus-url; gates that query Prometheus use it
	// unless their params name their own.
	PrometheusURL string
	// PrometheusCacheTTL is --prometheus-cache-ttl: how long gates reuse a
	// Prometheus answer unless their params say otherwise (0: each gate's
	// own default).
	PrometheusCacheTTL time.Duration
	// RedisURL is the deployment's Redis URL (REDIS_URL), for gates that keep
	// their budget in Redis and name no address of their own.
	RedisURL string
	// MaxConcurrency is the queue's concurrency (credits at budget 1).
	MaxConcurrency int
	// Build builds an inner gate, for gates that compose others.
	Build func(typ string, params Params) (Gate, error)
}

// Factory builds a gate from its parameters. It must report every parameter
// it does not know (Params.Unused helps) and every invalid value.
type Factory func(params Params, env Env) (Gate, error)

// Registry maps gate type names to factories: the "gate type" namespace of
// the generic registry (Register, Lookup, Has, Names: a duplicate type is an
// error, an unknown one an error naming the known ones), plus New, which
// builds a gate with the parameters every gate accepts.
type Registry struct {
	*registry.Registry[Factory]
}

// NewRegistry returns an empty registry.
func NewRegistry() *Registry { return &Registry{registry.New[Factory]("gate type")} }

// New builds a gate of type typ. It reads the generic parameters
// (failure_policy, refresh_interval) itself and gives the factory an
// env.Build that builds inner gates from this registry.
func (r *Registry) New(typ string, params Params, env Env) (Gate, error) {
	f, err := r.Lookup(typ)
	if err != nil {
		return nil, err
	}
	if env.Build == nil {
		env.Build = func(t string, p Params) (Gate, error) { return r.New(t, p, env) }
	}
	if params.used == nil {
		params = NewParams(nil)
	}
	policy, interval, err := genericParams(params)
	if err != nil {
		return nil, fmt.Errorf("gate %s: %w", typ, err)
	}
	g, err := f(params, env)
	if err != nil {
		return nil, fmt.Errorf("gate %s: %w", typ, err)
	}
	return wrapConfigured(g, policy, interval), nil
}

// Params are a gate's gate_params. Values arrive as JSON strings or numbers
// (upstream writes "100" and 100 alike); both read the same. Reading a key
// marks it used, so a factory can report the keys it never read.
type Params struct {
	vals map[string]string
	raw  map[string]json.RawMessage
	used map[string]bool
}

// NewParams builds Params from string values.
func NewParams(vals map[string]string) Params {
	p := Params{vals: map[string]string{}, raw: map[string]json.RawMessage{}, used: map[string]bool{}}
	for k, v := range vals {
		p.vals[k] = v
	}
	return p
}

// ParseParams builds Params from a JSON object whose values are strings,
// numbers or booleans; nested values (objects, arrays) are kept raw for
// gates that compose others (see Raw).
func ParseParams(obj map[string]json.RawMessage) (Params, error) {
	p := NewParams(nil)
	for k, v := range obj {
		s := strings.TrimSpace(string(v))
		switch {
		case s == "" || s == "null":
			continue
		case s[0] == '"':
			var str string
			if err := json.Unmarshal(v, &str); err != nil {
				return Params{}, fmt.Errorf("gate_params.%s: %w", k, err)
			}
			p.vals[k] = str
		case s[0] == '{' || s[0] == '[':
			p.raw[k] = v
		default:
			p.vals[k] = s
		}
	}
	return p, nil
}

// Canonical returns the parameters in one string that is the same for equal
// parameters however they were written ("100" and 100 read alike), so that
// queues with the same gate definition can share one gate.
func (p Params) Canonical() string {
	var b strings.Builder
	for _, k := range p.Keys() {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		if v, ok := p.vals[k]; ok {
			b.WriteString(strconv.Quote(v))
		} else {
			var compact bytes.Buffer
			if err := json.Compact(&compact, p.raw[k]); err != nil {
				compact.Write(p.raw[k])
			}
			b.Write(compact.Bytes())
		}
		b.WriteByte(';')
	}
	return b.String()
}

// Keys lists every key, sorted.
func (p Params) Keys() []string {
	out := make([]string, 0, len(p.vals)+len(p.raw))
	for k := range p.vals {
		out = append(out, k)
	}
	for k := range p.raw {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// String returns the value of key, or def when absent.
func (p Params) String(key, def string) string {
	if p.used != nil {
		p.used[key] = true
	}
	if v, ok := p.vals[key]; ok {
		return v
	}
	return def
}

// Has reports whether key is set, without marking it used.
func (p Params) Has(key string) bool {
	_, v := p.vals[key]
	_, r := p.raw[key]
	return v || r
}

// Raw returns a nested JSON value (object or array) of key, or nil.
func (p Params) Raw(key string) json.RawMessage {
	if p.used != nil {
		p.used[key] = true
	}
	return p.raw[key]
}

// Float returns the value of key as a number, or def when absent.
func (p Params) Float(key string, def float64) (float64, error) {
	s := p.String(key, "")
	if s == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
	if err != nil {
		return 0, fmt.Errorf("gate_params.%s: %q is not a number", key, s)
	}
	return f, nil
}

// Int returns the value of key as an integer, or def when absent.
func (p Params) Int(key string, def int) (int, error) {
	f, err := p.Float(key, float64(def))
	if err != nil {
		return 0, err
	}
	if f != float64(int(f)) {
		return 0, fmt.Errorf("gate_params.%s: %v is not an integer", key, f)
	}
	return int(f), nil
}

// Duration returns the value of key as a duration ("250ms", or a number of
// seconds), or def when absent.
func (p Params) Duration(key string, def time.Duration) (time.Duration, error) {
	s := p.String(key, "")
	if s == "" {
		return def, nil
	}
	if d, err := time.ParseDuration(s); err == nil {
		return d, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return 0, fmt.Errorf("gate_params.%s: %q is not a duration", key, s)
	}
	return time.Duration(f * float64(time.Second)), nil
}

// Unused returns an error naming every key that was never read, or nil.
func (p Params) Unused() error {
	var unknown []string
	for _, k := range p.Keys() {
		if !p.used[k] {
			unknown = append(unknown, k)
		}
	}
	if len(unknown) == 0 {
		return nil
	}
	return fmt.Errorf("unknown gate_params: %s", strings.Join(unknown, ", "))
}
