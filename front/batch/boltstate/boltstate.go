// Package boltstate is the Batch API's local embedded state store
// (front/batch.State) on bbolt: one file, every change one fsynced
// transaction, so a front killed at any point restarts on what it had
// recorded. It serves a single node (one process opens the file).
package boltstate

import (
	"context"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	bolt "go.etcd.io/bbolt"
	bolterrors "go.etcd.io/bbolt/errors"

	"github.com/sluice-io/sluice/front/batch"
)

var (
	bucketFiles   = []byte("files")
	bucketJobs    = []byte("jobs")
	bucketOwners  = []byte("owners")
	bucketRecords = []byte("records") // one nested bucket per job
)

// Store is a bbolt-backed batch.State.
type Store struct {
	db *bolt.DB
}

var _ batch.State = (*Store)(nil)

// Open opens (creating) the store file at path.
func Open(path string) (*Store, error) {
	db, err := bolt.Open(path, 0o600, &bolt.Options{Timeout: 5 * time.Second})
	if err != nil {
		return nil, fmt.Errorf("open batch state %s: %w", path, err)
	}
	err = db.Update(func(tx *bolt.Tx) error {
		for _, b := range [][]byte{bucketFiles, bucketJobs, bucketOwners, bucketRecords} {
			if _, err := tx.CreateBucketIfNotExists(b); err != nil {
				return err
			}
		}
		return nil
	})
	if err != nil {
		_ = db.Close()
		return nil, fmt.Errorf("open batch state %s: %w", path, err)
	}
	return &Store{db: db}, nil
}

// Close implements batch.State.
func (s *Store) Close() error { return s.db.Close() }

func put(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b, err := json.Marshal(v)
	if err != nil {
		return err
	}
	return tx.Bucket(bucket).Put([]byte(key), b)
}

func get(tx *bolt.Tx, bucket []byte, key string, v any) error {
	b := tx.Bucket(bucket).Get([]byte(key))
	if b == nil {
		return fmt.Errorf("%s %s: %w", bucket[:len(bucket)-1], key, batch.ErrNotFound)
	}
	return json.Unmarshal(b, v)
}

// PutFile implements batch.State.
func (s *Store) PutFile(_ context.Context, f batch.File) error {
	return s.db.Update(func(tx *bolt.Tx) error { return put(tx, bucketFiles, f.ID, f) })
}

// GetFile implements batch.State.
func (s *Store) GetFile(_ context.Context, id string) (batch.File, error) {
	var f batch.File
	err := s.db.View(func(tx *bolt.Tx) error { return get(tx, bucketFiles, id, &f) })
	return f, err
}

// DeleteFile implements batch.State.
func (s *Store) DeleteFile(_ context.Context, id string) error {
	return s.db.Update(func(tx *bolt.Tx) error { return tx.Bucket(bucketFiles).Delete([]byte(id)) })
}

// list returns up to limit values of bucket newest first (ids sort by
// creation), after key after.
func list[T any](db *bolt.DB, bucket []byte, after string, limit int) ([]T, bool, error) {
	var out []T
	more := false
	err := db.View(func(tx *bolt.Tx) error {
		c := tx.Bucket(bucket).Cursor()
		var k, v []byte
		if after == "" {
			k, v = c.Last()
		} else {
			k, _ = c.Seek([]byte(after))
			if k == nil {
				k, v = c.Last()
			} else {
				k, v = c.Prev()
			}
		}
		for ; k != nil; k, v = c.Prev() {
			if len(out) == limit {
				more = true
				return nil
			}
			var t T
			if err := json.Unmarshal(v, &t); err != nil {
				return fmt.Errorf("%s %s: %w", bucket, k, err)
			}
			out = append(out, t)
		}
		return nil
	})
	return out, more, err
}

// ListFiles implements batch.State.
func (s *Store) ListFiles(_ context.Context, after string, limit int) ([]batch.File, bool, error) {
	return list[batch.File](s.db, bucketFiles, after, limit)
}

// CreateJob implements batch.State.
func (s *Store) CreateJob(_ context.Context, j batch.Job) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if tx.Bucket(bucketJobs).Get([]byte(j.ID)) != nil {
			return fmt.Errorf("job %s exists", j.ID)
		}
		return put(tx, bucketJobs, j.ID, j)
	})
}

// UpdateJob implements batch.State.
func (s *Store) UpdateJob(_ context.Context, id string, fn func(*batch.Job) error) (batch.Job, error) {
	var j batch.Job
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, bucketJobs, id, &j); err != nil {
			return err
		}
		counts := j.Counts
		if err := fn(&j); err != nil {
			return err
		}
		j.Counts.Completed, j.Counts.Failed = counts.Completed, counts.Failed
		return put(tx, bucketJobs, id, j)
	})
	return j, err
}

// GetJob implements batch.State.
func (s *Store) GetJob(_ context.Context, id string) (batch.Job, error) {
	var j batch.Job
	err := s.db.View(func(tx *bolt.Tx) error { return get(tx, bucketJobs, id, &j) })
	return j, err
}

// ListJobs implements batch.State.
func (s *Store) ListJobs(_ context.Context, after string, limit int) ([]batch.Job, bool, error) {
	return list[batch.Job](s.db, bucketJobs, after, limit)
}

// ActiveJobs implements batch.State.
func (s *Store) ActiveJobs(_ context.Context) ([]string, error) {
	var ids []string
	err := s.db.View(func(tx *bolt.Tx) error {
		return tx.Bucket(bucketJobs).ForEach(func(k, v []byte) error {
			var j struct {
				Status string `json:"status"`
			}
			if err := json.Unmarshal(v, &j); err != nil {
				return fmt.Errorf("job %s: %w", k, err)
			}
			if !batch.Final(j.Status) {
				ids = append(ids, string(k))
			}
			return nil
		})
	})
	return ids, err
}

func indexKey(i int) []byte {
	var b [8]byte
	binary.BigEndian.PutUint64(b[:], uint64(i))
	return b[:]
}

// A record's value is one byte, recordOK or recordFailed, then the line
// as it is (the index is the key): no JSON to encode and decode per line,
// which was the largest per-line cost of writing a batch's output files
// (docs/benchmarks.md, batch-api). Values written as JSON by earlier
// versions (a line always starts with '{', never with these bytes) are
// still read.
const (
	recordFailed byte = 0
	recordOK     byte = 1
)

func encodeRecord(r batch.Record) []byte {
	b := make([]byte, 1+len(r.Line))
	if r.OK {
		b[0] = recordOK
	}
	copy(b[1:], r.Line)
	return b
}

// decodeRecord reads the record stored under key k; its line is bolt's
// memory, valid until the transaction ends (Records lends it to fn, as
// batch.State allows, instead of copying every line of a job).
func decodeRecord(k, v []byte) (batch.Record, error) {
	if len(k) != 8 {
		return batch.Record{}, fmt.Errorf("record key %x: not a line index", k)
	}
	idx := int(binary.BigEndian.Uint64(k))
	if len(v) > 0 && (v[0] == recordOK || v[0] == recordFailed) {
		return batch.Record{Index: idx, OK: v[0] == recordOK, Line: v[1:len(v):len(v)]}, nil
	}
	var r batch.Record
	if err := json.Unmarshal(v, &r); err != nil {
		return batch.Record{}, fmt.Errorf("record %d: %w", idx, err)
	}
	return r, nil
}

// Record implements batch.State: the records and the job's counts change
// in one transaction.
func (s *Store) Record(_ context.Context, id string, recs []batch.Record) (batch.Counts, error) {
	var j batch.Job
	err := s.db.Update(func(tx *bolt.Tx) error {
		if err := get(tx, bucketJobs, id, &j); err != nil {
			return err
		}
		rb, err := tx.Bucket(bucketRecords).CreateBucketIfNotExists([]byte(id))
		if err != nil {
			return err
		}
		// Line indexes come mostly in order, each after the last: full
		// pages (bbolt's default fills half of each when it splits) write
		// half as many pages per step.
		rb.FillPercent = 1.0
		for _, r := range recs {
			k := indexKey(r.Index)
			if rb.Get(k) != nil {
				continue
			}
			if err := rb.Put(k, encodeRecord(r)); err != nil {
				return err
			}
			if r.OK {
				j.Counts.Completed++
			} else {
				j.Counts.Failed++
			}
		}
		return put(tx, bucketJobs, id, j)
	})
	return j.Counts, err
}

// Records implements batch.State.
func (s *Store) Records(_ context.Context, id string, fn func(batch.Record) error) error {
	return s.db.View(func(tx *bolt.Tx) error {
		rb := tx.Bucket(bucketRecords).Bucket([]byte(id))
		if rb == nil {
			return nil
		}
		return rb.ForEach(func(k, v []byte) error {
			r, err := decodeRecord(k, v)
			if err != nil {
				return err
			}
			return fn(r)
		})
	})
}

// DeleteJob implements batch.State.
func (s *Store) DeleteJob(_ context.Context, id string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		if err := tx.Bucket(bucketRecords).DeleteBucket([]byte(id)); err != nil && !errors.Is(err, bolterrors.ErrBucketNotFound) {
			return err
		}
		if err := tx.Bucket(bucketOwners).Delete([]byte(id)); err != nil {
			return err
		}
		return tx.Bucket(bucketJobs).Delete([]byte(id))
	})
}

type owner struct {
	Owner string `json:"owner"`
	Until int64  `json:"until"` // Unix ns
}

// Own implements batch.State.
func (s *Store) Own(_ context.Context, id, who string, ttl time.Duration) (bool, error) {
	ok := false
	err := s.db.Update(func(tx *bolt.Tx) error {
		var o owner
		now := time.Now()
		if err := get(tx, bucketOwners, id, &o); err == nil && o.Owner != who && o.Until > now.UnixNano() {
			return nil
		}
		ok = true
		return put(tx, bucketOwners, id, owner{Owner: who, Until: now.Add(ttl).UnixNano()})
	})
	return ok, err
}

// Release implements batch.State.
func (s *Store) Release(_ context.Context, id, who string) error {
	return s.db.Update(func(tx *bolt.Tx) error {
		var o owner
		if err := get(tx, bucketOwners, id, &o); err != nil || o.Owner != who {
			return nil
		}
		return tx.Bucket(bucketOwners).Delete([]byte(id))
	})
}
