package batch

import (
	"context"
	"errors"
	"time"
)

// ErrNotFound is returned (wrapped) by a State for an id it does not hold.
var ErrNotFound = errors.New("not found")

// State is where the Batch API keeps what must survive a crash of a front
// replica: file records, batch jobs, every result recorded so far, and who
// owns (processes) each batch. Backends: front/batch/boltstate (a local
// embedded store, single node) and front/batch/redisstate (Redis, for the
// Redis transports; several replicas). The conformance suite is
// front/batch/statetest. A State is safe for concurrent use.
type State interface {
	// PutFile writes (or replaces) a file record.
	PutFile(ctx context.Context, f File) error
	// GetFile returns file id.
	GetFile(ctx context.Context, id string) (File, error)
	// DeleteFile removes file id (missing is not an error).
	DeleteFile(ctx context.Context, id string) error
	// ListFiles returns up to limit files, newest first, starting after
	// id after ("" from the newest), and whether more follow.
	ListFiles(ctx context.Context, after string, limit int) ([]File, bool, error)

	// CreateJob writes a new job; an existing id is an error.
	CreateJob(ctx context.Context, j Job) error
	// UpdateJob reads job id, lets fn change it and writes it back in
	// one step (fn's error aborts). Counts.Completed and Counts.Failed
	// are the store's (Record's): fn's changes to them are ignored.
	UpdateJob(ctx context.Context, id string, fn func(*Job) error) (Job, error)
	// GetJob returns job id with its counts.
	GetJob(ctx context.Context, id string) (Job, error)
	// ListJobs returns up to limit jobs, newest first, after id after.
	ListJobs(ctx context.Context, after string, limit int) ([]Job, bool, error)
	// ActiveJobs returns the ids of the jobs not yet in a final status.
	ActiveJobs(ctx context.Context) ([]string, error)

	// Record records results of job id by line index, idempotently: a
	// line recorded already keeps its first record and is not counted
	// again. It returns the job's counts after the step.
	Record(ctx context.Context, id string, recs []Record) (Counts, error)
	// Records calls fn for every record of job id in line order. The
	// record's Line is valid only until fn returns (a store may lend its
	// own memory): fn copies what it keeps.
	Records(ctx context.Context, id string, fn func(Record) error) error
	// DeleteJob removes job id, its records and its owner.
	DeleteJob(ctx context.Context, id string) error

	// Own takes or renews the ownership of job id for owner until ttl from
	// now; false when another owner holds an unexpired one.
	Own(ctx context.Context, id, owner string, ttl time.Duration) (bool, error)
	// Release gives up owner's ownership of job id.
	Release(ctx context.Context, id, owner string) error

	// Close releases the store.
	Close() error
}

// Counts are a job's request counts (OpenAI's request_counts).
type Counts struct {
	Total     int64 `json:"total"`
	Completed int64 `json:"completed"`
	Failed    int64 `json:"failed"`
}

// Record is the answer to one line of a job's input: the line of the
// output file (OK) or of the error file (not OK) it becomes.
type Record struct {
	Index int    `json:"i"`
	OK    bool   `json:"ok"`
	Line  []byte `json:"l"` // one JSON object, without the newline
}

// File is a file record (OpenAI's File object, less the constants).
type File struct {
	ID        string `json:"id"`
	Bytes     int64  `json:"bytes"`
	CreatedAt int64  `json:"created_at"`
	Filename  string `json:"filename"`
	Purpose   string `json:"purpose"`
	ExpiresAt int64  `json:"expires_at,omitempty"`
	// Lines is how many lines an input file holds (0 for others).
	Lines int `json:"lines,omitempty"`
}

// Job is a batch as the store keeps it.
type Job struct {
	ID               string            `json:"id"`
	Endpoint         string            `json:"endpoint"`
	InputFileID      string            `json:"input_file_id"`
	CompletionWindow string            `json:"completion_window"`
	Status           string            `json:"status"`
	Metadata         map[string]string `json:"metadata,omitempty"`
	Model            string            `json:"model,omitempty"`
	OutputFileID     string            `json:"output_file_id,omitempty"`
	ErrorFileID      string            `json:"error_file_id,omitempty"`
	Errors           []LineError       `json:"errors,omitempty"`
	// OutputExpiresAfter is how long the output and error files live
	// (seconds; 0: FileExpiry).
	OutputExpiresAfter int64 `json:"output_expires_after,omitempty"`

	CreatedAt    int64 `json:"created_at"`
	InProgressAt int64 `json:"in_progress_at,omitempty"`
	ExpiresAt    int64 `json:"expires_at,omitempty"`
	FinalizingAt int64 `json:"finalizing_at,omitempty"`
	CompletedAt  int64 `json:"completed_at,omitempty"`
	FailedAt     int64 `json:"failed_at,omitempty"`
	ExpiredAt    int64 `json:"expired_at,omitempty"`
	CancellingAt int64 `json:"cancelling_at,omitempty"`
	CancelledAt  int64 `json:"cancelled_at,omitempty"`

	// Enqueued is how many lines were put on the queue (in line order),
	// so a resumed job enqueues from there.
	Enqueued int `json:"enqueued"`
	// CancelSent is set once the queue was told to cancel the job.
	CancelSent bool `json:"cancel_sent,omitempty"`

	Counts Counts `json:"request_counts"`
	// Usage is the tokens of the answered lines, summed when the output
	// files are written (nil before).
	Usage *Usage `json:"usage,omitempty"`
}

// The statuses of a batch, as OpenAI names them.
const (
	StatusValidating = "validating"
	StatusFailed     = "failed"
	StatusInProgress = "in_progress"
	StatusFinalizing = "finalizing"
	StatusCompleted  = "completed"
	StatusExpired    = "expired"
	StatusCancelling = "cancelling"
	StatusCancelled  = "cancelled"
)

// Final reports whether status is one a batch never leaves.
func Final(status string) bool {
	switch status {
	case StatusFailed, StatusCompleted, StatusExpired, StatusCancelled:
		return true
	}
	return false
}

// LineError is one error of a batch (OpenAI's BatchError): a line of the
// input that does not validate, or why the batch failed.
type LineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Param   string `json:"param,omitempty"`
	Line    int    `json:"line,omitempty"`
}
