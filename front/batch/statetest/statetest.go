// Package statetest is the conformance suite of front/batch.State
// backends: files and jobs listed newest first with cursors, job updates
// that keep the recorded counts, results recorded once per line however
// often they are recorded, and ownership leases that exclude another owner
// until they lapse.
package statetest

import (
	"context"
	"errors"
	"fmt"
	"testing"
	"time"

	"github.com/sluice-io/sluice/front/batch"
)

// Run runs the suite; open returns a fresh, empty store (the suite closes it).
func Run(t *testing.T, open func(t testing.TB) batch.State) {
	t.Run("Files", func(t *testing.T) { files(t, open(t)) })
	t.Run("Jobs", func(t *testing.T) { jobs(t, open(t)) })
	t.Run("RecordOnce", func(t *testing.T) { recordOnce(t, open(t)) })
	t.Run("Ownership", func(t *testing.T) { ownership(t, open(t)) })
}

var ctx = context.Background()

func files(t *testing.T, s batch.State) {
	defer s.Close()
	for i := range 5 {
		if err := s.PutFile(ctx, batch.File{ID: fmt.Sprintf("file-%02d", i), Bytes: int64(i), Purpose: "batch"}); err != nil {
			t.Fatal(err)
		}
	}
	f, err := s.GetFile(ctx, "file-03")
	if err != nil || f.Bytes != 3 {
		t.Fatalf("GetFile = %+v, %v", f, err)
	}
	if _, err := s.GetFile(ctx, "file-99"); !errors.Is(err, batch.ErrNotFound) {
		t.Errorf("GetFile of a missing id: %v, want ErrNotFound", err)
	}
	page, more, err := s.ListFiles(ctx, "", 2)
	if err != nil || len(page) != 2 || !more || page[0].ID != "file-04" || page[1].ID != "file-03" {
		t.Fatalf("first page = %+v more %v, %v; want file-04, file-03 and more", page, more, err)
	}
	page, more, err = s.ListFiles(ctx, "file-03", 10)
	if err != nil || len(page) != 3 || more || page[0].ID != "file-02" || page[2].ID != "file-00" {
		t.Fatalf("after file-03 = %+v more %v, %v", page, more, err)
	}
	if err := s.DeleteFile(ctx, "file-02"); err != nil {
		t.Fatal(err)
	}
	if err := s.DeleteFile(ctx, "file-02"); err != nil {
		t.Errorf("deleting a missing file: %v", err)
	}
	if _, err := s.GetFile(ctx, "file-02"); !errors.Is(err, batch.ErrNotFound) {
		t.Errorf("deleted file: %v, want ErrNotFound", err)
	}
}

func jobs(t *testing.T, s batch.State) {
	defer s.Close()
	for i := range 3 {
		if err := s.CreateJob(ctx, batch.Job{ID: fmt.Sprint("batch_", i), Status: batch.StatusValidating}); err != nil {
			t.Fatal(err)
		}
	}
	if err := s.CreateJob(ctx, batch.Job{ID: "batch_1"}); err == nil {
		t.Error("creating an existing job succeeded")
	}
	j, err := s.UpdateJob(ctx, "batch_1", func(j *batch.Job) error {
		j.Status, j.Counts.Total, j.Counts.Completed = batch.StatusInProgress, 10, 99
		return nil
	})
	if err != nil || j.Status != batch.StatusInProgress || j.Counts.Total != 10 || j.Counts.Completed != 0 {
		t.Fatalf("UpdateJob = %+v, %v; want in_progress, total 10, completed untouched (0)", j, err)
	}
	stop := errors.New("stop")
	if _, err := s.UpdateJob(ctx, "batch_1", func(j *batch.Job) error { j.Status = "x"; return stop }); !errors.Is(err, stop) {
		t.Errorf("UpdateJob with a failing fn: %v", err)
	}
	if j, _ := s.GetJob(ctx, "batch_1"); j.Status != batch.StatusInProgress {
		t.Errorf("an aborted update changed the job: %s", j.Status)
	}
	if _, err := s.UpdateJob(ctx, "batch_9", func(*batch.Job) error { return nil }); !errors.Is(err, batch.ErrNotFound) {
		t.Errorf("UpdateJob of a missing job: %v", err)
	}
	if _, err := s.UpdateJob(ctx, "batch_2", func(j *batch.Job) error { j.Status = batch.StatusCompleted; return nil }); err != nil {
		t.Fatal(err)
	}
	active, err := s.ActiveJobs(ctx)
	if err != nil || len(active) != 2 {
		t.Fatalf("ActiveJobs = %v, %v; want batch_0 and batch_1", active, err)
	}
	list, more, err := s.ListJobs(ctx, "", 2)
	if err != nil || len(list) != 2 || !more || list[0].ID != "batch_2" {
		t.Fatalf("ListJobs = %+v more %v, %v", list, more, err)
	}
	if err := s.DeleteJob(ctx, "batch_0"); err != nil {
		t.Fatal(err)
	}
	if _, err := s.GetJob(ctx, "batch_0"); !errors.Is(err, batch.ErrNotFound) {
		t.Errorf("deleted job: %v", err)
	}
}

func recordOnce(t *testing.T, s batch.State) {
	defer s.Close()
	if err := s.CreateJob(ctx, batch.Job{ID: "batch_r", Status: batch.StatusInProgress, Counts: batch.Counts{Total: 4}}); err != nil {
		t.Fatal(err)
	}
	rec := func(i int, ok bool, line string) batch.Record {
		return batch.Record{Index: i, OK: ok, Line: []byte(line)}
	}
	c, err := s.Record(ctx, "batch_r", []batch.Record{rec(2, true, `{"a":2}`), rec(0, false, `{"a":0}`)})
	if err != nil || c.Completed != 1 || c.Failed != 1 || c.Total != 4 {
		t.Fatalf("Record = %+v, %v", c, err)
	}
	// The same lines again (a result read twice), and one new one.
	c, err = s.Record(ctx, "batch_r", []batch.Record{rec(2, false, `{"dup":2}`), rec(0, true, `{"dup":0}`), rec(1, true, `{"a":1}`), rec(1, true, `{"dup":1}`)})
	if err != nil || c.Completed != 2 || c.Failed != 1 {
		t.Fatalf("Record again = %+v, %v; want 2 completed, 1 failed", c, err)
	}
	if j, _ := s.GetJob(ctx, "batch_r"); j.Counts != c {
		t.Errorf("GetJob counts %+v, Record said %+v", j.Counts, c)
	}
	var got []string
	if err := s.Records(ctx, "batch_r", func(r batch.Record) error {
		got = append(got, fmt.Sprintf("%d:%v:%s", r.Index, r.OK, r.Line))
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	want := []string{`0:false:{"a":0}`, `1:true:{"a":1}`, `2:true:{"a":2}`}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Errorf("Records = %v, want %v (line order, first record kept)", got, want)
	}
	if _, err := s.Record(ctx, "batch_missing", []batch.Record{rec(0, true, "{}")}); !errors.Is(err, batch.ErrNotFound) {
		t.Errorf("Record on a missing job: %v", err)
	}
}

func ownership(t *testing.T, s batch.State) {
	defer s.Close()
	const ttl = 300 * time.Millisecond
	ok, err := s.Own(ctx, "batch_o", "a", ttl)
	if err != nil || !ok {
		t.Fatalf("first Own = %v, %v", ok, err)
	}
	if ok, _ := s.Own(ctx, "batch_o", "b", ttl); ok {
		t.Error("b took a job a owns")
	}
	if ok, _ := s.Own(ctx, "batch_o", "a", ttl); !ok {
		t.Error("a could not renew its own")
	}
	time.Sleep(ttl + 100*time.Millisecond)
	if ok, _ := s.Own(ctx, "batch_o", "b", ttl); !ok {
		t.Error("b could not take a lapsed ownership")
	}
	if err := s.Release(ctx, "batch_o", "a"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Own(ctx, "batch_o", "a", ttl); ok {
		t.Error("a's Release freed b's ownership")
	}
	if err := s.Release(ctx, "batch_o", "b"); err != nil {
		t.Fatal(err)
	}
	if ok, _ := s.Own(ctx, "batch_o", "a", ttl); !ok {
		t.Error("a could not own a released job")
	}
}
