// Package batch is the OpenAI Batch API on sluice's own queues: /v1/files
// (upload a JSONL file of requests, list, retrieve, delete, download) and
// /v1/batches (create a job from a file, retrieve, list, cancel).
//
// A job's lines become requests on one request queue (through a
// core/submit Producer), each with the job's deadline (created_at plus the
// completion window), metadata.job_id = the batch id, and the job's own
// result route, so the dispatcher writes the job's results where only the
// job reads them. The replica that owns the job (an ownership lease in the
// State) reads the route, records each result by line index, idempotently,
// and acks it; another replica takes a job whose owner stopped renewing its
// lease and carries on from what was recorded, so every line is answered
// exactly once in the output and error files, which are assembled from the
// records when the job ends. Cancel and expiry remove what is still queued,
// abort what is in flight, and answer the lines left without a result with
// batch_cancelled or batch_expired (partial output). See docs/batch.md.
package batch

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"time"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/filestore"
)

func randomHex(n int) string {
	b := make([]byte, n)
	_, _ = rand.Read(b)
	return hex.EncodeToString(b)
}

// newID returns prefix + a time-ordered unique suffix (ids sort by creation).
func newID(prefix string) string {
	return fmt.Sprintf("%s%016x%s", prefix, time.Now().UnixNano(), randomHex(4))
}

// Service is the Batch API of one front replica: its HTTP handler and the
// loop that processes the jobs it owns.
type Service struct {
	cfg   Config
	state State
	files filestore.Store
	prod  submit.Producer
	log   *slog.Logger

	mu      sync.Mutex
	running map[string]bool
	wg      sync.WaitGroup
	// kick wakes Run's scan at once when this replica creates a job,
	// instead of at the next ScanInterval tick.
	kick chan struct{}
}

// New returns a service; it does not close state, files or prod.
func New(cfg Config, state State, files filestore.Store, prod submit.Producer, log *slog.Logger) (*Service, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Service{cfg: cfg, state: state, files: files, prod: prod, log: log, running: map[string]bool{}, kick: make(chan struct{}, 1)}, nil
}

// Run processes jobs until ctx ends: it owns the jobs nobody owns (its
// own after a restart, those of a replica that died) and carries each to
// its end. It returns once every job it runs has stopped.
func (s *Service) Run(ctx context.Context) error {
	t := time.NewTicker(s.cfg.ScanInterval)
	defer t.Stop()
	defer s.wg.Wait()
	var swept time.Time
	for {
		s.scan(ctx)
		if time.Since(swept) >= time.Minute {
			s.sweep(ctx, time.Now())
			swept = time.Now()
		}
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.kick:
		}
	}
}

// wake makes Run scan now (a job was created here); it never blocks.
func (s *Service) wake() {
	select {
	case s.kick <- struct{}{}:
	default:
	}
}

// sweep deletes the files whose expires_at passed (record and content).
func (s *Service) sweep(ctx context.Context, now time.Time) {
	after := ""
	var expired []string
	for {
		fs, more, err := s.state.ListFiles(ctx, after, 100)
		if err != nil {
			if ctx.Err() == nil {
				s.log.Warn("batch: listing files for expiry failed", "err", err)
			}
			return
		}
		for _, f := range fs {
			if f.ExpiresAt > 0 && f.ExpiresAt <= now.Unix() {
				expired = append(expired, f.ID)
			}
			after = f.ID
		}
		if !more {
			break
		}
	}
	for _, id := range expired {
		if err := s.deleteFileID(ctx, id); err != nil {
			s.log.Warn("batch: deleting an expired file failed", "file", id, "err", err)
		}
	}
}

// scan takes the active jobs nobody owns and starts processing them.
func (s *Service) scan(ctx context.Context) {
	ids, err := s.state.ActiveJobs(ctx)
	if err != nil {
		if ctx.Err() == nil {
			s.log.Warn("batch: listing active jobs failed", "err", err)
		}
		return
	}
	for _, id := range ids {
		s.mu.Lock()
		busy := s.running[id]
		s.mu.Unlock()
		if busy {
			continue
		}
		ok, err := s.state.Own(ctx, id, s.cfg.Owner, s.cfg.OwnerLease)
		if err != nil || !ok {
			continue
		}
		s.mu.Lock()
		s.running[id] = true
		s.mu.Unlock()
		s.wg.Add(1)
		go func() {
			defer s.wg.Done()
			defer func() {
				s.mu.Lock()
				delete(s.running, id)
				s.mu.Unlock()
			}()
			if err := s.own(ctx, id); err != nil && ctx.Err() == nil {
				s.log.Error("batch: job stopped", "batch", id, "err", err)
			}
		}()
	}
}

// own processes job id while it renews the ownership lease; losing the
// lease stops the processing.
func (s *Service) own(ctx context.Context, id string) error {
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	go func() {
		t := time.NewTicker(s.cfg.OwnerLease / 3)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return
			case <-t.C:
			}
			ok, err := s.state.Own(ctx, id, s.cfg.Owner, s.cfg.OwnerLease)
			if err == nil && !ok {
				cancel(errors.New("ownership lost"))
				return
			}
		}
	}()
	err := s.process(ctx, id)
	if ctx.Err() == nil {
		_ = s.state.Release(context.WithoutCancel(ctx), id, s.cfg.Owner)
	}
	return err
}

func (s *Service) route(id string) string { return s.cfg.RoutePrefix + id }

// process carries job id from its status to a final one.
func (s *Service) process(ctx context.Context, id string) error {
	j, err := s.state.GetJob(ctx, id)
	if err != nil {
		return err
	}
	var kept []inputLine // the lines validation read, when it kept them
	if j.Status == StatusValidating {
		if j, kept, err = s.validate(ctx, j); err != nil || Final(j.Status) {
			return err
		}
	}
	if j.Status == StatusInProgress {
		if j, err = s.enqueue(ctx, j, kept); err != nil {
			return err
		}
		kept = nil // free for the collecting
	}
	return s.collect(ctx, j)
}

func (s *Service) fail(ctx context.Context, id string, errs []LineError) (Job, error) {
	return s.state.UpdateJob(ctx, id, func(j *Job) error {
		j.Status, j.FailedAt, j.Errors = StatusFailed, time.Now().Unix(), errs
		return nil
	})
}

// keepLinesBytes is the largest input file whose lines validation keeps
// in memory for enqueueing, which then neither reads the file again nor
// parses its lines a second time; a larger file is read twice.
const keepLinesBytes = 64 << 20

// validate checks every line of the input file; a file with an invalid
// line fails the job with the lines' errors (as OpenAI's validation). It
// returns the valid lines it read when the file is at most
// keepLinesBytes, for enqueue.
func (s *Service) validate(ctx context.Context, j Job) (Job, []inputLine, error) {
	fail := func(errs []LineError) (Job, []inputLine, error) {
		j, err := s.fail(ctx, j.ID, errs)
		return j, nil, err
	}
	rc, err := s.files.Open(ctx, j.InputFileID, 0)
	if err != nil {
		if errors.Is(err, filestore.ErrNotFound) {
			return fail([]LineError{{Code: "file_not_found", Message: "The input file " + j.InputFileID + " is gone."}})
		}
		return j, nil, err
	}
	defer rc.Close()
	var kept []inputLine
	var arena []byte // the bodies of kept, one allocation
	lines := 0       // the file's lines as its upload counted them
	if f, err := s.state.GetFile(ctx, j.InputFileID); err == nil {
		lines = min(f.Lines, s.cfg.MaxLines)
		if f.Bytes <= keepLinesBytes {
			kept, arena = make([]inputLine, 0, f.Lines+1), make([]byte, 0, f.Bytes)
		}
	}
	// The custom_ids' set sized at once (growing it rehashed it 17 times).
	c := &checker{endpoint: j.Endpoint, ids: make(map[string]struct{}, lines), maxErrs: 100}
	err = validateLines(ctx, rc, j.Endpoint, s.cfg.MaxLines, func(lc lineCheck) {
		customID, body, ok := c.accept(lc)
		switch {
		case !ok || len(c.errs) > 0:
			kept = nil // the job fails: nothing to enqueue
		case kept != nil && len(arena)+len(body) <= cap(arena):
			at := len(arena)
			arena = append(arena, body...)
			kept = append(kept, inputLine{CustomID: customID, URL: j.Endpoint, Body: arena[at:len(arena):len(arena)]})
		default:
			kept = nil // the file grew since its record: read it again
		}
	})
	switch {
	case ctx.Err() != nil:
		return j, nil, ctx.Err() // stopping: the next owner validates again
	case errors.Is(err, errTooManyLines):
		return fail([]LineError{{Code: "too_many_requests", Message: fmt.Sprintf("The input file holds more than %d requests.", s.cfg.MaxLines)}})
	case err != nil:
		return fail([]LineError{{Code: "invalid_file", Message: "The input file cannot be read: " + err.Error()}})
	case len(c.errs) > 0:
		return fail(c.errs)
	case c.lines == 0:
		return fail([]LineError{{Code: "empty_file", Message: "The input file holds no requests."}})
	}
	j, err = s.state.UpdateJob(ctx, j.ID, func(j *Job) error {
		if j.Status != StatusValidating {
			return nil // cancelled meanwhile
		}
		j.Status, j.InProgressAt, j.Model, j.Counts.Total = StatusInProgress, time.Now().Unix(), c.model, int64(c.lines)
		return nil
	})
	if len(kept) != c.lines {
		kept = nil
	}
	return j, kept, err
}

// enqueue puts the lines from j.Enqueued on the queue in chunks, recording
// progress after each, so a resumed job goes on from the last chunk
// recorded. A chunk enqueued twice (the front died before recording it)
// is queued once when the producer takes idempotent submits
// (submit.Capabilities.Idempotent), else answered twice and recorded once.
// kept are the job's lines as validation read them, or nil to read them
// from the input file.
func (s *Service) enqueue(ctx context.Context, j Job, kept []inputLine) (Job, error) {
	if j.Enqueued >= int(j.Counts.Total) {
		return j, nil
	}
	lines := func(fn func(l inputLine) error) error {
		for _, l := range kept {
			if err := fn(l); err != nil {
				return err
			}
		}
		return nil
	}
	if kept == nil {
		rc, err := s.files.Open(ctx, j.InputFileID, 0)
		if err != nil {
			return j, err
		}
		defer rc.Close()
		lines = func(fn func(l inputLine) error) error {
			return eachLine(rc, func(_ int, b []byte) error {
				l, err := parseInput(b)
				if err != nil {
					return err // validated before: the file changed
				}
				return fn(l)
			})
		}
	}
	deadline := time.Unix(j.ExpiresAt, 0)
	created := time.Now()
	// With idempotent submits each line is submitted under its request id:
	// a chunk submitted again after a crash (before its progress was
	// recorded) queues nothing twice. Its created is then the job's start,
	// the same in every attempt, so the request's identity is too.
	ip, idempotent := s.prod.(submit.IdempotentProducer)
	idempotent = idempotent && s.prod.Capabilities().Idempotent
	if idempotent && j.InProgressAt > 0 {
		created = time.Unix(j.InProgressAt, 0)
	}
	route := s.route(j.ID)
	chunk := make([]*wire.Request, 0, s.cfg.ChunkSize)
	idx := -1
	flush := func() error {
		if len(chunk) == 0 {
			return nil
		}
		if idempotent {
			keys := make([]string, len(chunk))
			for i, r := range chunk {
				keys[i] = r.ID
			}
			if _, err := ip.SubmitIdempotent(ctx, s.cfg.Queue, chunk, keys); err != nil {
				return err
			}
		} else if err := s.prod.Enqueue(ctx, s.cfg.Queue, chunk); err != nil {
			return err
		}
		n := idx + 1
		var err error
		j, err = s.state.UpdateJob(ctx, j.ID, func(j *Job) error {
			j.Enqueued = n
			return nil
		})
		chunk = chunk[:0]
		return err
	}
	err := lines(func(l inputLine) error {
		idx++
		if idx < j.Enqueued {
			return nil
		}
		chunk = append(chunk, &wire.Request{
			ID: requestID(j.ID, idx), Created: created, Deadline: deadline, Payload: l.Body,
			Metadata:        map[string]string{"job_id": j.ID, "custom_id": l.CustomID},
			Endpoint:        l.URL,
			ResultQueueName: route,
			Model:           j.Model,
		})
		if len(chunk) == s.cfg.ChunkSize {
			return flush()
		}
		return nil
	})
	if err == nil {
		err = flush()
	}
	if err != nil {
		return j, fmt.Errorf("enqueue batch %s: %w", j.ID, err)
	}
	return j, nil
}

// collect reads the job's route and records its results until every line
// has one, the job is cancelled or it expires; then it finalizes.
func (s *Service) collect(ctx context.Context, j Job) error {
	r, err := s.prod.Results(ctx, s.route(j.ID))
	if err != nil {
		return err
	}
	defer r.Close()
	ending := "" // the final status once cancelled or expired
	// windowEnded: a line was answered DEADLINE_EXCEEDED, which for a
	// line (whose deadline is the batch's expires_at) means the window
	// ended before it was done: with a dispatcher running, the window's
	// end answers every open line before this loop sees the clock
	windowEnded := false
	var endStart, lastResult time.Time
	tally := &usageTally{exact: j.Counts.Completed+j.Counts.Failed == 0}
	for {
		if j.Counts.Completed+j.Counts.Failed >= j.Counts.Total {
			break
		}
		if ending == "" {
			switch {
			case j.Status == StatusCancelling:
				ending = StatusCancelled
			case j.Status == StatusFinalizing:
				ending = StatusExpired // finalizing with lines missing: the window ended
			case time.Now().Unix() >= j.ExpiresAt:
				ending = StatusExpired
			}
			if ending != "" {
				if j, err = s.stop(ctx, j, ending); err != nil {
					return err
				}
				endStart, lastResult = time.Now(), time.Now()
			}
		} else if now := time.Now(); now.Sub(lastResult) >= s.cfg.CancelQuiet || now.Sub(endStart) >= s.cfg.CancelWait {
			break
		}
		rs, err := s.gather(ctx, r, j.Counts.Total-j.Counts.Completed-j.Counts.Failed)
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			s.log.Warn("batch: reading results failed", "batch", j.ID, "err", err)
		}
		if len(rs) > 0 {
			lastResult = time.Now()
			recs := make([]Record, 0, len(rs))
			us := make([]*lineUsage, 0, len(rs))
			for _, res := range rs {
				if res.Result == nil {
					s.log.Warn("batch: undecodable result dropped", "batch", j.ID, "err", res.Err)
					continue
				}
				i, ok := lineIndex(j.ID, res.Result.ID)
				if !ok || i >= int(j.Counts.Total) {
					s.log.Warn("batch: result of another request on the job's route dropped", "batch", j.ID, "id", res.Result.ID)
					continue
				}
				windowEnded = windowEnded || res.Result.ErrorCode == wire.CodeDeadlineExceeded
				rec, u := recordOf(i, res.Result.Metadata["custom_id"], res.Result)
				recs, us = append(recs, rec), append(us, u)
			}
			counts, err := s.state.Record(ctx, j.ID, recs)
			if err != nil {
				return err // not acked: handed out again
			}
			tally.recorded(us, counts.Completed+counts.Failed-j.Counts.Completed-j.Counts.Failed)
			j.Counts = counts
			if err := r.Ack(ctx, rs...); err != nil {
				s.log.Warn("batch: ack failed (the results come again and are recorded once)", "batch", j.ID, "err", err)
			}
		}
		if ending == "" {
			// The status may have moved by the API (cancel).
			fresh, err := s.state.GetJob(ctx, j.ID)
			if err != nil {
				return err
			}
			j = fresh
		}
	}
	if ending == "" {
		switch {
		case j.Status == StatusCancelling:
			ending = StatusCancelled // every line answered while cancelling
		case j.Status == StatusFinalizing && j.CancelSent:
			ending = StatusExpired // resumed after the expiry answered every line
		case windowEnded && time.Now().Unix() >= j.ExpiresAt:
			// the dispatcher answered the window's end: expired, as
			// if this loop had seen the clock first
			if j, err = s.stop(ctx, j, StatusExpired); err != nil {
				return err
			}
			ending = StatusExpired
		default:
			ending = StatusCompleted
		}
	}
	var usage *Usage
	if tally.exact {
		usage = &tally.sum
	}
	return s.finalize(ctx, j, ending, usage)
}

// gather reads the next results of a job's route: it waits up to 500ms
// for a first one; when fewer than ChunkSize (and fewer than left, the
// lines still without a record) came, it lets RecordWait pass and then
// takes what arrived meanwhile, up to ChunkSize, so that one state step
// records many (group commit). It sleeps through the window rather than
// reading on every publish, which would cost a read per few results;
// but in the job's last step (left at most ChunkSize) it looks every
// lastStepPoll and ends the window once every line left has a result,
// so the job's end does not wait out the window.
func (s *Service) gather(ctx context.Context, r submit.Reader, left int64) ([]submit.Result, error) {
	nctx, cancel := context.WithTimeout(ctx, 500*time.Millisecond)
	rs, err := r.Next(nctx)
	cancel()
	if err != nil || len(rs) == 0 || len(rs) >= s.cfg.ChunkSize || int64(len(rs)) >= left {
		return rs, err
	}
	if left <= int64(s.cfg.ChunkSize) {
		return s.gatherLast(ctx, r, rs, left), nil
	}
	t := time.NewTimer(s.cfg.RecordWait)
	select {
	case <-ctx.Done():
		t.Stop()
		return rs, nil // the caller sees ctx end; these are handed out again
	case <-t.C:
	}
	for len(rs) < s.cfg.ChunkSize && int64(len(rs)) < left {
		// What is there now: a short wait, not another window.
		tctx, cancel := context.WithTimeout(ctx, time.Millisecond)
		more, err := r.Next(tctx)
		cancel()
		if err != nil || len(more) == 0 {
			break
		}
		rs = append(rs, more...)
	}
	return rs, nil
}

// lastStepPoll is how often gather looks for the results of a job's last
// step during its window.
const lastStepPoll = time.Millisecond

// gatherLast is gather's window for the job's last step: rs came, left
// lines have no record; it takes what arrives every lastStepPoll until
// left results came or RecordWait passed.
func (s *Service) gatherLast(ctx context.Context, r submit.Reader, rs []submit.Result, left int64) []submit.Result {
	end := time.Now().Add(s.cfg.RecordWait)
	for int64(len(rs)) < left {
		wait := min(lastStepPoll, time.Until(end))
		if wait <= 0 {
			break
		}
		tctx, cancel := context.WithTimeout(ctx, wait)
		more, err := r.Next(tctx)
		cancel()
		if ctx.Err() != nil {
			break // the caller sees ctx end; these are handed out again
		}
		if err != nil && !errors.Is(err, context.DeadlineExceeded) {
			break
		}
		rs = append(rs, more...)
	}
	return rs
}

// stop cancels what is left of job j on the queue (once: CancelSent) as it
// becomes ending (cancelled: it is cancelling already; expired).
func (s *Service) stop(ctx context.Context, j Job, ending string) (Job, error) {
	if j.CancelSent {
		return j, nil
	}
	n, err := s.prod.Cancel(ctx, s.cfg.Queue, transport.Cancellation{JobID: j.ID})
	if err != nil {
		return j, fmt.Errorf("cancel batch %s on %s: %w", j.ID, s.cfg.Queue, err)
	}
	s.log.Info("batch: cancelled on the queue", "batch", j.ID, "removed", n, "as", ending)
	return s.state.UpdateJob(ctx, j.ID, func(j *Job) error {
		j.CancelSent = true
		if ending == StatusExpired && j.FinalizingAt == 0 {
			j.Status, j.FinalizingAt = StatusFinalizing, time.Now().Unix()
		}
		return nil
	})
}

// finalize answers the lines left without a result, writes the output and
// error files from the records, and gives the job its final status. It is
// idempotent (file ids are the job's), so a resumed job finalizes again.
// usage is the usage of the job's records when the caller summed it (see
// usageTally), nil to sum it from the records.
func (s *Service) finalize(ctx context.Context, j Job, final string, usage *Usage) error {
	if final == StatusCompleted && j.Status != StatusFinalizing {
		var err error
		if j, err = s.state.UpdateJob(ctx, j.ID, func(j *Job) error {
			j.Status, j.FinalizingAt = StatusFinalizing, time.Now().Unix()
			return nil
		}); err != nil {
			return err
		}
	}
	if missing := j.Counts.Total - j.Counts.Completed - j.Counts.Failed; missing > 0 {
		code, msg := "batch_expired", "This request could not be executed before the completion window expired."
		if final == StatusCancelled {
			code, msg = "batch_cancelled", "This request was not executed: the batch was cancelled."
		}
		if err := s.answerMissing(ctx, j, code, msg); err != nil {
			return err
		}
		// The counts the files are written by include those answers.
		fresh, err := s.state.GetJob(ctx, j.ID)
		if err != nil {
			return err
		}
		j.Counts = fresh.Counts
	}
	outID, errID := "file-"+j.ID+"-output", "file-"+j.ID+"-errors"
	outN, errN, summed, err := s.writeOutputs(ctx, j, outID, errID, usage == nil)
	if err != nil {
		return err
	}
	if usage == nil {
		usage = &summed
	}
	_, err = s.state.UpdateJob(ctx, j.ID, func(j *Job) error {
		now := time.Now().Unix()
		j.Usage = usage
		if outN > 0 {
			j.OutputFileID = outID
		}
		if errN > 0 {
			j.ErrorFileID = errID
		}
		j.Status = final
		switch final {
		case StatusCompleted:
			j.CompletedAt = now
		case StatusExpired:
			j.ExpiredAt = now
		case StatusCancelled:
			j.CancelledAt = now
		}
		return nil
	})
	if err == nil {
		s.log.Info("batch: done", "batch", j.ID, "status", final, "output_lines", outN, "error_lines", errN)
	}
	return err
}

// answerMissing records an error line for every line without a record.
func (s *Service) answerMissing(ctx context.Context, j Job, code, msg string) error {
	have := make([]bool, j.Counts.Total)
	if err := s.state.Records(ctx, j.ID, func(r Record) error {
		if r.Index < len(have) {
			have[r.Index] = true
		}
		return nil
	}); err != nil {
		return err
	}
	rc, err := s.files.Open(ctx, j.InputFileID, 0)
	if err != nil {
		return err
	}
	defer rc.Close()
	var recs []Record
	idx := -1
	err = eachLine(rc, func(_ int, b []byte) error {
		idx++
		if idx >= len(have) || have[idx] {
			return nil
		}
		var l inputLine
		_ = jsonUnmarshal(b, &l)
		recs = append(recs, missingRecord(j.ID, idx, l.CustomID, code, msg))
		if len(recs) == s.cfg.ChunkSize {
			if _, err := s.state.Record(ctx, j.ID, recs); err != nil {
				return err
			}
			recs = recs[:0]
		}
		return nil
	})
	if err == nil && len(recs) > 0 {
		_, err = s.state.Record(ctx, j.ID, recs)
	}
	return err
}

// writeOutputs writes the output and error files of j from its records,
// streamed, and records them as files; it returns their line counts and,
// when sum is set, the usage of their lines. A file the counts say is
// empty (no completed or no failed line) is not written: its pass over the
// records is skipped.
func (s *Service) writeOutputs(ctx context.Context, j Job, outID, errID string, sum bool) (int, int, Usage, error) {
	var outN, errN int
	var usage Usage
	for _, f := range []struct {
		id    string
		ok    bool
		n     *int
		empty bool
	}{{outID, true, &outN, j.Counts.Completed == 0}, {errID, false, &errN, j.Counts.Failed == 0}} {
		if f.empty {
			_ = s.files.Delete(ctx, f.id) // none to write; none left from an earlier attempt
			continue
		}
		pr, pw := io.Pipe()
		go func() {
			bw := newLineWriter(pw)
			err := s.state.Records(ctx, j.ID, func(r Record) error {
				if r.OK != f.ok {
					return nil
				}
				*f.n++
				if sum {
					usage.add(r.Line)
				}
				return bw.line(r.Line)
			})
			if err == nil {
				err = bw.flush()
			}
			pw.CloseWithError(err)
		}()
		size, err := s.files.Put(ctx, f.id, pr)
		_ = pr.Close()
		if err != nil {
			return 0, 0, Usage{}, fmt.Errorf("write %s: %w", f.id, err)
		}
		if *f.n == 0 {
			_ = s.files.Delete(ctx, f.id)
			continue
		}
		now := time.Now()
		exp := s.cfg.FileExpiry
		if j.OutputExpiresAfter > 0 {
			exp = time.Duration(j.OutputExpiresAfter) * time.Second
		}
		if err := s.state.PutFile(ctx, File{ID: f.id, Bytes: size, CreatedAt: now.Unix(), Filename: f.id + ".jsonl",
			Purpose: "batch_output", ExpiresAt: now.Add(exp).Unix()}); err != nil {
			return 0, 0, Usage{}, err
		}
	}
	return outN, errN, usage, nil
}

// Summary is one job's progress, for the status page.
type Summary struct {
	ID     string
	Status string
	Counts Counts
}

// Summaries returns the newest jobs (up to n) with their progress.
func (s *Service) Summaries(ctx context.Context, n int) ([]Summary, error) {
	js, _, err := s.state.ListJobs(ctx, "", n)
	if err != nil {
		return nil, err
	}
	out := make([]Summary, len(js))
	for i, j := range js {
		out[i] = Summary{ID: j.ID, Status: j.Status, Counts: j.Counts}
	}
	return out, nil
}

// String renders a summary as "status done/total (failed)".
func (m Summary) String() string {
	return m.Status + " " + strconv.FormatInt(m.Counts.Completed+m.Counts.Failed, 10) + "/" + strconv.FormatInt(m.Counts.Total, 10) +
		" (" + strconv.FormatInt(m.Counts.Failed, 10) + " failed)"
}
