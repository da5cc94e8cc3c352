package main

import (
	"context"
	"io"
	"strings"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/filestore"
)

// The stages of one Batch API run, in milliseconds from the start of the
// upload: the figures say where the wall-clock time of the API side goes
// (which stages run in series that the direct side does not have). They
// are taken at the seams the bench builds the front from (its State,
// Producer and file Store wrapped, and the client's own calls), so the
// front runs unchanged.
var batchStageNames = []string{
	"upload",        // the upload answered (the file stored and recorded)
	"created",       // POST /v1/batches answered
	"validated",     // the job moved to in_progress (validation done)
	"first_enqueue", // the first chunk handed to the producer
	"last_enqueue",  // the last chunk's Enqueue returned
	"first_result",  // the first results read from the job's route
	"last_read",     // the last results read from it
	"last_result",   // the job's last results recorded (every line has one)
	"output_start",  // the output file's Put began
	"output_done",   // the output file's Put returned
	"completed",     // the job's status written completed
	"polled",        // the client's poll saw it completed
	"downloaded",    // the output file downloaded (the run's end)
}

// batchDirectStageNames are the baseline's stages: its last Enqueue
// returned, its first results read, its last result acked (its end).
var batchDirectStageNames = []string{"last_enqueue", "first_result", "done"}

// stageClock notes the first (or, with last, the latest) time of each
// stage of one run.
type stageClock struct {
	mu    sync.Mutex
	start time.Time
	at    map[string]time.Time
}

func newStageClock() *stageClock { return &stageClock{start: time.Now(), at: map[string]time.Time{}} }

// restart makes now the run's start.
func (c *stageClock) restart() {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.start = time.Now()
}

// elapsed is the time since the run's start.
func (c *stageClock) elapsed() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	return time.Since(c.start)
}

// first notes stage now unless it was noted before.
func (c *stageClock) first(stage string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if _, ok := c.at[stage]; !ok {
		c.at[stage] = time.Now()
	}
}

// last notes stage now, over an earlier note.
func (c *stageClock) last(stage string) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.at[stage] = time.Now()
}

// ms returns each stage's milliseconds since the start (absent stages are
// left out).
func (c *stageClock) ms() map[string]float64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	out := map[string]float64{}
	for k, t := range c.at {
		out[k] = float64(t.Sub(c.start).Microseconds()) / 1000
	}
	return out
}

// stageState notes the job's status changes.
type stageState struct {
	batch.State
	c *stageClock
}

func (s stageState) UpdateJob(ctx context.Context, id string, fn func(*batch.Job) error) (batch.Job, error) {
	j, err := s.State.UpdateJob(ctx, id, fn)
	if err == nil {
		switch j.Status {
		case batch.StatusInProgress:
			s.c.first("validated")
		case batch.StatusCompleted:
			s.c.first("completed")
		}
	}
	return j, err
}

func (s stageState) Record(ctx context.Context, id string, recs []batch.Record) (batch.Counts, error) {
	counts, err := s.State.Record(ctx, id, recs)
	if err == nil && counts.Total > 0 && counts.Completed+counts.Failed >= counts.Total {
		s.c.first("last_result")
	}
	return counts, err
}

// stageProducer notes the enqueues and the first results read.
type stageProducer struct {
	submit.Producer
	c *stageClock
}

func (p stageProducer) Enqueue(ctx context.Context, queue string, reqs []*wire.Request) error {
	p.c.first("first_enqueue")
	err := p.Producer.Enqueue(ctx, queue, reqs)
	p.c.last("last_enqueue")
	return err
}

func (p stageProducer) Results(ctx context.Context, route string) (submit.Reader, error) {
	r, err := p.Producer.Results(ctx, route)
	if err != nil {
		return nil, err
	}
	return stageReader{Reader: r, c: p.c}, nil
}

type stageReader struct {
	submit.Reader
	c *stageClock
}

func (r stageReader) Next(ctx context.Context) ([]submit.Result, error) {
	rs, err := r.Reader.Next(ctx)
	if len(rs) > 0 {
		r.c.first("first_result")
		r.c.last("last_read")
	}
	return rs, err
}

// stageFiles notes the output file's write.
type stageFiles struct {
	filestore.Store
	c *stageClock
}

func (f stageFiles) Put(ctx context.Context, id string, r io.Reader) (int64, error) {
	output := strings.HasSuffix(id, "-output") // the front's name for a job's output file
	if output {
		f.c.first("output_start")
	}
	n, err := f.Store.Put(ctx, id, r)
	if output {
		f.c.last("output_done")
	}
	return n, err
}
