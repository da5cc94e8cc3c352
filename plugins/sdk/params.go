package sdk

import (
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Params are the gate_params sluice forwards to a plugin, as strings: a
// number arrives in its shortest decimal form ("100"), a boolean as "true"
// or "false", and a nested object or array as its JSON text. An absent key
// and "" both read as the default. Reading a key marks it used, so that the
// SDK can report the ones Configure never read.
type Params struct {
	vals map[string]string
	used map[string]bool
}

// NewParams returns Params holding vals (copied).
func NewParams(vals map[string]string) Params {
	p := Params{vals: make(map[string]string, len(vals)), used: map[string]bool{}}
	for k, v := range vals {
		p.vals[k] = v
	}
	return p
}

// Keys lists every key, sorted.
func (p Params) Keys() []string {
	out := make([]string, 0, len(p.vals))
	for k := range p.vals {
		out = append(out, k)
	}
	sort.Strings(out)
	return out
}

// Has reports whether key is set, without marking it used.
func (p Params) Has(key string) bool {
	_, ok := p.vals[key]
	return ok
}

// String returns the value of key, or def when absent or "".
func (p Params) String(key, def string) string {
	if p.used != nil {
		p.used[key] = true
	}
	if v := p.vals[key]; v != "" {
		return v
	}
	return def
}

// Float returns the value of key as a number, or def when absent.
func (p Params) Float(key string, def float64) (float64, error) {
	s := strings.TrimSpace(p.String(key, ""))
	if s == "" {
		return def, nil
	}
	f, err := strconv.ParseFloat(s, 64)
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

// Bool returns the value of key as a boolean ("true", "false", "1", "0",
// "yes", "no"), or def when absent.
func (p Params) Bool(key string, def bool) (bool, error) {
	switch s := strings.ToLower(strings.TrimSpace(p.String(key, ""))); s {
	case "":
		return def, nil
	case "true", "1", "yes":
		return true, nil
	case "false", "0", "no":
		return false, nil
	default:
		return false, fmt.Errorf("gate_params.%s: %q is not true or false", key, s)
	}
}

// Duration returns the value of key as a duration ("250ms", or a number of
// seconds), or def when absent.
func (p Params) Duration(key string, def time.Duration) (time.Duration, error) {
	s := strings.TrimSpace(p.String(key, ""))
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
