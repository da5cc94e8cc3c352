package cancelset

import (
	"strings"

	"github.com/sluice-io/sluice/core/transport"
)

// The prefixes of the two kinds of entry.
const (
	jobPrefix     = "job:"
	requestPrefix = "req:"
)

// JobEntry is the entry that cancels every request of job id.
func JobEntry(id string) string { return jobPrefix + id }

// RequestEntry is the entry that cancels the one request id.
func RequestEntry(id string) string { return requestPrefix + id }

// Entries are the entries that record c: one for its job, one for its
// request, each when set (none when c names neither).
func Entries(c transport.Cancellation) []string {
	var out []string
	if c.JobID != "" {
		out = append(out, JobEntry(c.JobID))
	}
	if c.RequestID != "" {
		out = append(out, RequestEntry(c.RequestID))
	}
	return out
}

// Parse turns an entry back into the Cancellation it records; false for
// a string that is neither kind of entry.
func Parse(entry string) (transport.Cancellation, bool) {
	switch {
	case strings.HasPrefix(entry, jobPrefix):
		return transport.Cancellation{JobID: entry[len(jobPrefix):]}, true
	case strings.HasPrefix(entry, requestPrefix):
		return transport.Cancellation{RequestID: entry[len(requestPrefix):]}, true
	}
	return transport.Cancellation{}, false
}
