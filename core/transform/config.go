package transform

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"strconv"
)

// Config is the content of --transform-config-file (upstream's format):
//
//	{"requestTransforms": [
//	  {"name": "whisper", "type": "gcs_uri_multipart", "parameters": {"providers": ["whisper"]}}
//	]}
//
// Decoding is strict: an unknown key, at the top level (such as
// "responseTransforms") or in an entry, is an error. Each name must be
// non-empty and unique, each type non-empty and registered. No entries
// (an empty or absent array, or a file holding null) make a chain that
// does nothing.
type Config struct {
	// RequestTransforms are the transforms, in the order the chain runs them.
	RequestTransforms []Entry `json:"requestTransforms"`
}

// Entry is one transform of a Config.
type Entry struct {
	// Name names the transform in errors and logs; unique in the file.
	Name string `json:"name"`
	// Type is the registered transform type, e.g. "gcs_uri_multipart".
	Type string `json:"type"`
	// Parameters are given to the type's factory as they are (nil when absent).
	Parameters json.RawMessage `json:"parameters,omitempty"`
}

// Parse decodes and validates a config file's content; see Config for the
// rules. Errors name the entry by index and name; all of them are reported.
func Parse(data []byte) (Config, error) {
	var top struct {
		RequestTransforms []json.RawMessage `json:"requestTransforms"`
	}
	if err := decodeStrict(data, &top); err != nil {
		return Config{}, err
	}
	var cfg Config
	var errs []error
	for i, raw := range top.RequestTransforms {
		var e Entry
		if err := decodeStrict(raw, &e); err != nil {
			errs = append(errs, fmt.Errorf("requestTransforms[%d]: %w", i, err))
			continue
		}
		cfg.RequestTransforms = append(cfg.RequestTransforms, e)
	}
	if len(errs) > 0 {
		return Config{}, errors.Join(errs...)
	}
	if err := cfg.Validate(); err != nil {
		return Config{}, err
	}
	return cfg, nil
}

// Validate reports every entry without a name, with a name used before, or
// without a type. Whether a type is registered is checked by NewChain.
func (c Config) Validate() error {
	var errs []error
	seen := make(map[string]int, len(c.RequestTransforms))
	for i, e := range c.RequestTransforms {
		switch prev, dup := seen[e.Name]; {
		case e.Name == "":
			errs = append(errs, fmt.Errorf("%s: name is empty", e.label(i)))
		case dup:
			errs = append(errs, fmt.Errorf("%s: name is already used by requestTransforms[%d]", e.label(i), prev))
		default:
			seen[e.Name] = i
		}
		if e.Type == "" {
			errs = append(errs, fmt.Errorf("%s: type is empty", e.label(i)))
		}
	}
	return errors.Join(errs...)
}

// label names entry i in errors: requestTransforms[i] "name".
func (e Entry) label(i int) string {
	if e.Name == "" {
		return "requestTransforms[" + strconv.Itoa(i) + "]"
	}
	return "requestTransforms[" + strconv.Itoa(i) + "] " + strconv.Quote(e.Name)
}

// Load reads the config file at path and builds its chain with r. An empty
// path means no transforms: a chain that does nothing. Errors name the file.
func Load(path string, r *Registry, env Env) (*Chain, error) {
	if path == "" {
		return &Chain{}, nil
	}
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("transform config: %w", err)
	}
	cfg, err := Parse(data)
	if err != nil {
		return nil, fmt.Errorf("transform config %s: %w", path, err)
	}
	c, err := NewChain(cfg, r, env)
	if err != nil {
		return nil, fmt.Errorf("transform config %s: %w", path, err)
	}
	return c, nil
}

// decodeStrict decodes one JSON value from data into dst, rejecting unknown
// keys and anything but white space after the value.
func decodeStrict(data []byte, dst any) error {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.DisallowUnknownFields()
	if err := dec.Decode(dst); err != nil {
		if err == io.EOF {
			return errors.New("no JSON value")
		}
		return err
	}
	if _, err := dec.Token(); err != io.EOF {
		return errors.New("data after the JSON value")
	}
	return nil
}
