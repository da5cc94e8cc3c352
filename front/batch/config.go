package batch

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"reflect"
	"strings"
	"time"

	"github.com/sluice-io/sluice/internal/configtypes"
)

// Config configures a Service. It is also the batch_api section of a
// sluice config file, beside the keys `sluice serve` reads itself
// (enabled, listen, files, state): each field's key is its json name, a
// duration reads as the rest of the config's ("30s", "1m", or a number of
// seconds; see UnmarshalJSON), and a field left zero takes its default.
type Config struct {
	// Queue is the request queue jobs are put on (its broker name); the
	// dispatcher must route its results by the message (a queue without
	// its own result_queue_name). In a config file, the id or broker name
	// of a configured queue (default: the only queue).
	Queue string `json:"queue,omitempty"`
	// RoutePrefix starts every job's result route (default "sluice-batch:").
	RoutePrefix string `json:"route_prefix,omitempty"`
	// Owner names this replica in ownership leases (default host-pid-random).
	Owner string `json:"owner,omitempty"`
	// OwnerLease is how long a job stays owned without renewal (default 30s).
	OwnerLease time.Duration `json:"owner_lease,omitempty"`
	// MaxFileBytes bounds an upload (default 200 MB, OpenAI's).
	MaxFileBytes int64 `json:"max_file_bytes,omitempty"`
	// MaxLines bounds the requests of a file (default 50,000, OpenAI's).
	MaxLines int `json:"max_lines,omitempty"`
	// ChunkSize is how many requests one Enqueue carries (default 1000).
	ChunkSize int `json:"chunk_size,omitempty"`
	// FileExpiry is how long uploaded and output files live by default
	// (default 30 days, OpenAI's for purpose batch).
	FileExpiry time.Duration `json:"file_expiry,omitempty"`
	// CancelQuiet is how long a cancelled or expired job waits without a
	// new result before it answers the lines left (default 2s; at most
	// CancelWait in all).
	CancelQuiet time.Duration `json:"cancel_quiet,omitempty"`
	// CancelWait bounds the wait for the results of a cancelled or expired
	// job's requests in flight (default 1m).
	CancelWait time.Duration `json:"cancel_wait,omitempty"`
	// ScanInterval is how often the replica looks for jobs to own (default 1s).
	ScanInterval time.Duration `json:"scan_interval,omitempty"`
	// RecordWait is how long the collector of a job gathers the results
	// it reads before it records them in one state step (one transaction,
	// one fsync on the local store) and acks them: up to ChunkSize results
	// or this long after the first (default 20ms; the job's last step ends
	// sooner, once every line left has a result). A result is acked only
	// after its record is committed, as before; the wait trades that
	// much latency per result for fewer, larger steps.
	RecordWait time.Duration `json:"record_wait,omitempty"`
	// Windows are the completion windows accepted (default {"24h"}), each
	// a Go duration.
	Windows []string `json:"completion_windows,omitempty"`
}

// durationType is the type of Config's durations, which UnmarshalJSON
// reads as configtypes.Duration.
var durationType = reflect.TypeOf(time.Duration(0))

// UnmarshalJSON reads the keys of c present in b (fields absent keep their
// values). A duration is a Go duration string or a number of seconds
// (configtypes.Duration). Keys that are not c's are ignored: the
// batch_api section holds others, and its reader checks them all
// (config.UnknownKeys).
func (c *Config) UnmarshalJSON(b []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil {
		return err
	}
	v := reflect.ValueOf(c).Elem()
	for i := range v.NumField() {
		f := v.Type().Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		raw, ok := keys[name]
		if f.Type != durationType || !ok {
			continue
		}
		var d configtypes.Duration
		if err := json.Unmarshal(raw, &d); err != nil {
			return fmt.Errorf("%s: %w", name, err)
		}
		v.Field(i).SetInt(int64(d))
		delete(keys, name)
	}
	rest, err := json.Marshal(keys)
	if err != nil {
		return err
	}
	type plain Config // Config's fields without this method
	return json.Unmarshal(rest, (*plain)(c))
}

func (c *Config) setDefaults() {
	if c.RoutePrefix == "" {
		c.RoutePrefix = "sluice-batch:"
	}
	if c.Owner == "" {
		h, _ := os.Hostname()
		c.Owner = fmt.Sprintf("%s-%d-%s", h, os.Getpid(), randomHex(4))
	}
	if c.OwnerLease <= 0 {
		c.OwnerLease = 30 * time.Second
	}
	if c.MaxFileBytes <= 0 {
		c.MaxFileBytes = 200 << 20
	}
	if c.MaxLines <= 0 {
		c.MaxLines = 50000
	}
	if c.ChunkSize <= 0 {
		c.ChunkSize = 1000
	}
	if c.FileExpiry <= 0 {
		c.FileExpiry = 30 * 24 * time.Hour
	}
	if c.CancelQuiet <= 0 {
		c.CancelQuiet = 2 * time.Second
	}
	if c.CancelWait <= 0 {
		c.CancelWait = time.Minute
	}
	if c.ScanInterval <= 0 {
		c.ScanInterval = time.Second
	}
	if c.RecordWait <= 0 {
		c.RecordWait = 20 * time.Millisecond
	}
	if len(c.Windows) == 0 {
		c.Windows = []string{"24h"}
	}
}

// Validate checks c and fills its defaults: a negative setting is refused
// (zero takes the default), every completion window is a positive
// duration, and the queue is named. It returns every problem (errors.Join).
func (c *Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		key string
		v   int64
	}{{"max_file_bytes", c.MaxFileBytes}, {"max_lines", int64(c.MaxLines)}, {"chunk_size", int64(c.ChunkSize)}} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("%s %d is negative", f.key, f.v))
		}
	}
	for _, f := range []struct {
		key string
		d   time.Duration
	}{{"owner_lease", c.OwnerLease}, {"file_expiry", c.FileExpiry}, {"cancel_quiet", c.CancelQuiet},
		{"cancel_wait", c.CancelWait}, {"scan_interval", c.ScanInterval}, {"record_wait", c.RecordWait}} {
		if f.d < 0 {
			errs = append(errs, fmt.Errorf("%s %v is negative", f.key, f.d))
		}
	}
	c.setDefaults()
	for _, w := range c.Windows {
		if d, err := time.ParseDuration(w); err != nil || d <= 0 {
			errs = append(errs, fmt.Errorf("completion window %q is not a positive duration", w))
		}
	}
	if c.Queue == "" {
		errs = append(errs, errors.New("queue is empty"))
	}
	for i, err := range errs {
		errs[i] = fmt.Errorf("batch: %w", err) // each line names the component
	}
	return errors.Join(errs...)
}
