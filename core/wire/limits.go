package wire

import (
	"errors"
	"fmt"
)

// Limits bound what one request may carry. A request over a limit is
// answered INVALID_REQUEST with the reason Check gives, which names the
// limit's configuration key (limits.<name>). Zero fields take the defaults
// (SetDefaults); a negative field turns that limit off.
type Limits struct {
	// MaxPayloadBytes bounds the payload, the body sent to the gateway
	// (default 16 MiB).
	MaxPayloadBytes int `json:"max_payload_bytes,omitempty"`
	// MaxHeaders bounds how many headers a request may ask to forward (default 64).
	MaxHeaders int `json:"max_headers,omitempty"`
	// MaxHeaderBytes bounds the headers' names and values, summed (default 16 KiB).
	MaxHeaderBytes int `json:"max_header_bytes,omitempty"`
	// MaxMetadataKeys bounds how many metadata keys a request carries
	// (default 256); they are echoed in its result.
	MaxMetadataKeys int `json:"max_metadata_keys,omitempty"`
	// MaxMetadataBytes bounds the metadata's keys and values, summed (default 64 KiB).
	MaxMetadataBytes int `json:"max_metadata_bytes,omitempty"`
}

// The default limits.
const (
	DefaultMaxPayloadBytes  = 16 << 20
	DefaultMaxHeaders       = 64
	DefaultMaxHeaderBytes   = 16 << 10
	DefaultMaxMetadataKeys  = 256
	DefaultMaxMetadataBytes = 64 << 10
)

// SetDefaults fills the zero fields.
func (l *Limits) SetDefaults() {
	def := func(v *int, d int) {
		if *v == 0 {
			*v = d
		}
	}
	def(&l.MaxPayloadBytes, DefaultMaxPayloadBytes)
	def(&l.MaxHeaders, DefaultMaxHeaders)
	def(&l.MaxHeaderBytes, DefaultMaxHeaderBytes)
	def(&l.MaxMetadataKeys, DefaultMaxMetadataKeys)
	def(&l.MaxMetadataBytes, DefaultMaxMetadataBytes)
}

// ErrLimit is wrapped by every error Check returns.
var ErrLimit = errors.New("request over a limit")

// Check returns nil when r is within every limit (a limit ≤ 0 is off), or
// an error naming the first limit exceeded, its value and r's.
func (l *Limits) Check(r *Request) error {
	over := func(key string, limit, got int, what string) error {
		return fmt.Errorf("%w: %s is %d, above limits.%s (%d)", ErrLimit, what, got, key, limit)
	}
	if l.MaxPayloadBytes > 0 && len(r.Payload) > l.MaxPayloadBytes {
		return over("max_payload_bytes", l.MaxPayloadBytes, len(r.Payload), "payload size in bytes")
	}
	if l.MaxHeaders > 0 && len(r.Headers) > l.MaxHeaders {
		return over("max_headers", l.MaxHeaders, len(r.Headers), "header count")
	}
	if l.MaxHeaderBytes > 0 {
		if n := mapBytes(r.Headers); n > l.MaxHeaderBytes {
			return over("max_header_bytes", l.MaxHeaderBytes, n, "header size in bytes (names and values)")
		}
	}
	if l.MaxMetadataKeys > 0 && len(r.Metadata) > l.MaxMetadataKeys {
		return over("max_metadata_keys", l.MaxMetadataKeys, len(r.Metadata), "metadata key count")
	}
	if l.MaxMetadataBytes > 0 {
		if n := mapBytes(r.Metadata); n > l.MaxMetadataBytes {
			return over("max_metadata_bytes", l.MaxMetadataBytes, n, "metadata size in bytes (keys and values)")
		}
	}
	return nil
}

func mapBytes(m map[string]string) int {
	n := 0
	for k, v := range m {
		n += len(k) + len(v)
	}
	return n
}
