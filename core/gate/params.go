package gate

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sort"
	"strconv"
	"strings"
	"time"
)

// Params are a gate's gate_params, read as upstream reads them:
//
//   - a string reader (String) takes a string, a number (in its shortest
//     decimal form: 100.0 reads "100") or a boolean ("true", "false");
//   - number readers (Float, Int) take a number or a string holding one;
//   - Duration takes a Go duration string ("250ms") or, beyond upstream, a
//     number of seconds;
//   - Raw takes an object or an array, or a string holding one (upstream's
//     composite "gates" is often written as a JSON string), and StringMap an
//     object or a string holding one, its values read as String reads them.
//
// An absent key, null and "" all read as the default. Reading a key marks
// it used, so a factory can report the keys it never read.
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
// gates that compose others (see Raw). Null and "" values are left out, so
// they read as absent.
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
			if str != "" {
				p.vals[k] = str
			}
		case s[0] == '{' || s[0] == '[':
			p.raw[k] = v
		case s == "true" || s == "false":
			p.vals[k] = s
		default:
			f, err := strconv.ParseFloat(s, 64)
			if err != nil {
				return Params{}, fmt.Errorf("gate_params.%s: %s is not a string, number, boolean, object or array", k, s)
			}
			p.vals[k] = strconv.FormatFloat(f, 'f', -1, 64)
		}
	}
	return p, nil
}

// Canonical returns the parameters in one string that is the same for equal
// parameters however they were written ("100", 100 and 100.0 read alike, as
// do a nested array and a string holding it), so that
// queues with the same gate definition can share one gate.
func (p Params) Canonical() string {
	var b strings.Builder
	for _, k := range p.Keys() {
		b.WriteString(strconv.Quote(k))
		b.WriteByte('=')
		v, ok := p.vals[k]
		raw := p.raw[k]
		if ok {
			// A string holding JSON (a composite's "gates") reads like the
			// JSON itself.
			if s := strings.TrimSpace(v); s != "" && (s[0] == '[' || s[0] == '{') && json.Valid([]byte(s)) {
				ok, raw = false, json.RawMessage(s)
			}
		}
		if ok {
			b.WriteString(strconv.Quote(v))
		} else {
			var compact bytes.Buffer
			if err := json.Compact(&compact, raw); err != nil {
				compact.Write(raw)
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

// String returns the value of key, or def when absent or "". An object or
// array reads as def, as upstream's string reader has it.
func (p Params) String(key, def string) string {
	if p.used != nil {
		p.used[key] = true
	}
	if v, ok := p.vals[key]; ok && v != "" {
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

// Raw returns the nested JSON value (object or array) of key, or nil. A
// string value that holds an object or an array (upstream accepts
// "gates": "[{...}]" as well as "gates": [{...}]) is returned as that JSON;
// whether it is well-formed is the caller's decoder to say.
func (p Params) Raw(key string) json.RawMessage {
	if p.used != nil {
		p.used[key] = true
	}
	if r, ok := p.raw[key]; ok {
		return r
	}
	if s := strings.TrimSpace(p.vals[key]); s != "" && (s[0] == '[' || s[0] == '{') {
		return json.RawMessage(s)
	}
	return nil
}

// StringMap returns the value of key as a string map, or nil when absent:
// an object, or a string holding one (upstream's string-map reader). Each
// value reads as String would read it (a number in its shortest decimal
// form, a boolean as "true"/"false"); a nested value keeps its JSON text.
func (p Params) StringMap(key string) (map[string]string, error) {
	raw := p.Raw(key)
	if raw == nil {
		if p.String(key, "") != "" {
			return nil, fmt.Errorf("gate_params.%s: want an object or a JSON string holding one", key)
		}
		return nil, nil
	}
	var obj map[string]json.RawMessage
	if err := json.Unmarshal(raw, &obj); err != nil {
		return nil, fmt.Errorf("gate_params.%s: want an object: %w", key, err)
	}
	out := make(map[string]string, len(obj))
	for k, v := range obj {
		s := strings.TrimSpace(string(v))
		switch {
		case s == "null":
			out[k] = ""
		case strings.HasPrefix(s, `"`):
			var str string
			if err := json.Unmarshal(v, &str); err != nil {
				return nil, fmt.Errorf("gate_params.%s.%s: %w", key, k, err)
			}
			out[k] = str
		default:
			if f, err := strconv.ParseFloat(s, 64); err == nil {
				out[k] = strconv.FormatFloat(f, 'f', -1, 64)
			} else {
				out[k] = s
			}
		}
	}
	return out, nil
}

// Float returns the value of key as a number, or def when absent.
func (p Params) Float(key string, def float64) (float64, error) {
	if _, nested := p.raw[key]; nested {
		p.String(key, "") // marks it used
		return 0, fmt.Errorf("gate_params.%s: want a number, got an object or array", key)
	}
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

// GateSpec is one gate configuration as upstream writes it inside
// gate_params (wait-on-refuse's "gate", a composite's "gates"):
// {"gate_type": "...", "gate_params": {...}}. Unknown keys are errors.
type GateSpec struct {
	// GateType is the inner gate's registry name (required).
	GateType string `json:"gate_type"`
	// GateParams are the inner gate's gate_params, keeping their JSON types.
	GateParams map[string]json.RawMessage `json:"gate_params,omitempty"`
}

// Gate reads key as one required gate configuration (upstream's single-gate
// reader): an object, or a JSON string holding one. It returns the inner
// gate's type and its parameters, parsed as ParseParams parses a queue's
// gate_params, ready for Env.Build.
func (p Params) Gate(key string) (string, Params, error) {
	raw := p.Raw(key)
	if raw == nil {
		if p.Has(key) {
			return "", Params{}, fmt.Errorf("gate_params.%s: want an object {\"gate_type\":...,\"gate_params\":{...}} or a JSON string holding one", key)
		}
		return "", Params{}, fmt.Errorf("gate_params.%s is required: one {\"gate_type\":...,\"gate_params\":{...}}", key)
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var spec GateSpec
	if err := dec.Decode(&spec); err != nil {
		return "", Params{}, fmt.Errorf("gate_params.%s: %w", key, err)
	}
	if dec.More() {
		return "", Params{}, fmt.Errorf("gate_params.%s: more than one JSON value", key)
	}
	if spec.GateType == "" {
		return "", Params{}, fmt.Errorf("gate_params.%s: gate_type is required", key)
	}
	params, err := ParseParams(spec.GateParams)
	if err != nil {
		return "", Params{}, fmt.Errorf("gate_params.%s: %w", key, err)
	}
	return spec.GateType, params, nil
}
