package dispatch

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
)

// Fairness defaults, upstream's (mergepolicy/internal/fairness).
const (
	// DefaultFairnessHeader is the header the fairness id is stamped under
	// when FairnessConfig.Header is nil.
	DefaultFairnessHeader = "x-llm-d-inference-fairness-id"
	// DefaultFairnessAttribute is the metadata key the fairness id is read
	// from when FairnessConfig.Attribute is "".
	DefaultFairnessAttribute = "userid"
	// MaxFairnessIDBytes is the longest id stamped: a longer one is not
	// stamped (and a header the message set is left in place).
	MaxFairnessIDBytes = 256
)

// FairnessConfig configures the fairness stamp: Do sends the value of a
// metadata attribute (the tenant's id) in a header, so that the gateway's
// flow control can share capacity between tenants. It is upstream's merge
// policy parameters fairness_header and fairness_attribute (ParseFairness
// reads them), with upstream's rules:
//
//   - With no configuration, stamping is on: metadata.userid is sent as
//     x-llm-d-inference-fairness-id.
//   - The id is stamped when it is non-empty, at most MaxFairnessIDBytes long
//     and a valid header value; it then replaces the header in any letter
//     case the message's headers set it (the stamp wins over the caller).
//     Otherwise nothing is stamped, and a header the message set is sent as
//     it came.
//
// The zero value is usable after SetDefaults.
type FairnessConfig struct {
	// Header names the header the id is sent in. nil means
	// DefaultFairnessHeader; a pointer to "" disables stamping (a pointer
	// tells an absent setting from an empty one, as upstream does). Any
	// other value must be a valid header name that the client does not
	// reserve (see CheckHeaderName).
	Header *string
	// Attribute is the metadata key whose value is the id. "" means
	// DefaultFairnessAttribute.
	Attribute string
}

// SetDefaults fills unset fields with their defaults.
func (f *FairnessConfig) SetDefaults() {
	if f.Header == nil {
		h := DefaultFairnessHeader
		f.Header = &h
	}
	if f.Attribute == "" {
		f.Attribute = DefaultFairnessAttribute
	}
}

// Validate reports an invalid header name. It accepts an unset (nil) or
// empty Header.
func (f FairnessConfig) Validate() error {
	if f.Header == nil || *f.Header == "" {
		return nil
	}
	if err := CheckHeaderName(*f.Header); err != nil {
		return fmt.Errorf("fairness_header: %w", err)
	}
	return nil
}

// headerName returns the canonical name of the stamped header, or "" when
// stamping is disabled. Call it after SetDefaults.
func (f FairnessConfig) headerName() string {
	if f.Header == nil {
		return ""
	}
	return http.CanonicalHeaderKey(*f.Header)
}

// ParseFairness reads the fairness settings from the "parameters" object of
// upstream's merge-policy file ({"type": ..., "parameters": {...}}), which
// both of its policies (random-robin and tier-priority) accept:
// fairness_header (a string; absent or null: the default header; "":
// stamping disabled) and fairness_attribute (a string; absent, null or "":
// userid). Like upstream, it ignores the other parameters (the policy's
// own), and absent parameters (nil, empty or null) give the defaults.
//
// A value that is not a string, and a fairness_header that is not a valid
// header name, are errors. The result is validated but its defaults are not
// filled: pass it as Config.Fairness.
func ParseFairness(params json.RawMessage) (FairnessConfig, error) {
	var f FairnessConfig
	if len(bytes.TrimSpace(params)) == 0 {
		return f, nil
	}
	var p struct {
		Header    *string `json:"fairness_header"`
		Attribute *string `json:"fairness_attribute"`
	}
	if err := json.Unmarshal(params, &p); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return f, fmt.Errorf("merge policy parameters: %s: must be a string, got %s", te.Field, te.Value)
		}
		return f, fmt.Errorf("merge policy parameters: must be a JSON object: %w", err)
	}
	f.Header = p.Header
	if p.Attribute != nil {
		f.Attribute = *p.Attribute
	}
	if err := f.Validate(); err != nil {
		return FairnessConfig{}, fmt.Errorf("merge policy parameters: %w", err)
	}
	return f, nil
}

// CheckHeaderName reports whether name can be set by configuration (the
// fairness header, a per-call header such as a priority header): it must be
// a valid HTTP header name (an RFC 9110 token) and not one the client
// reserves (hop-by-hop and framing headers, proxy credentials,
// Content-Type, Accept-Encoding). The client's deadline and timeout headers
// are refused too, per client: see Client.CheckHeaderName.
func CheckHeaderName(name string) error {
	if !validToken(name) {
		return fmt.Errorf("%q is not a valid header name", name)
	}
	if refusedHeader(http.CanonicalHeaderKey(name)) {
		return fmt.Errorf("%q is a header sluice does not let configuration or messages set", name)
	}
	return nil
}

// CheckHeaderName is the package's CheckHeaderName, also refusing this
// client's deadline and timeout headers: a name it accepts is sent by
// Do when given in Overrides.Headers. Use it to check a configured header
// name at startup.
func (c *Client) CheckHeaderName(name string) error {
	if err := CheckHeaderName(name); err != nil {
		return err
	}
	if ck := http.CanonicalHeaderKey(name); ck == c.deadlineHeader || ck == c.timeoutHeader {
		return fmt.Errorf("%q is the client's deadline or timeout header", name)
	}
	return nil
}
