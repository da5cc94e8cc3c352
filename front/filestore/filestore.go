// Package filestore is where the Batch API keeps files: the uploaded JSONL
// inputs and the output and error files it writes. A file is written once
// under an id the caller chooses and read back whole or from an offset;
// there is no update in place (an output file is assembled from parts and
// published under its final id when the job finishes).
//
// Backends live in one package each: filestore/disk (the default: a
// directory, written through a temporary file and renamed, so a crash
// leaves no half file under a final id), filestore/s3 (any S3-compatible
// store) and filestore/gcs (Google Cloud Storage's JSON API). The
// conformance suite in filestore/filestoretest runs against each.
package filestore

import (
	"context"
	"errors"
	"io"
	"time"
)

// ErrNotFound is returned (wrapped) for an id the store does not hold.
var ErrNotFound = errors.New("file not found")

// Store keeps immutable files by id. It is safe for concurrent use.
type Store interface {
	// Put writes r whole under id and returns its size. The file appears
	// under id only once it is complete; an existing id is replaced.
	Put(ctx context.Context, id string, r io.Reader) (int64, error)
	// Open reads file id from byte offset (0: from the start).
	Open(ctx context.Context, id string, offset int64) (io.ReadCloser, error)
	// Stat returns file id's size and when it was written.
	Stat(ctx context.Context, id string) (Info, error)
	// Delete removes file id; deleting a missing id is not an error.
	Delete(ctx context.Context, id string) error
}

// Info describes one stored file.
type Info struct {
	Size    int64
	Written time.Time
}
