package batch

import (
	"bytes"
	"context"
	"fmt"
	"reflect"
	"strings"
	"testing"

	"github.com/sluice-io/sluice/core/submit"
	"github.com/sluice-io/sluice/core/transport"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/front/filestore/disk"
)

// oneJobState holds one job and one file record: what validate and
// enqueue use of a State.
type oneJobState struct {
	State
	job  Job
	file File
}

func (s *oneJobState) GetFile(context.Context, string) (File, error) { return s.file, nil }

func (s *oneJobState) UpdateJob(_ context.Context, _ string, fn func(*Job) error) (Job, error) {
	err := fn(&s.job)
	return s.job, err
}

// capture is a producer that keeps what is enqueued.
type capture struct {
	submit.Producer
	reqs []*wire.Request
}

func (c *capture) Enqueue(_ context.Context, _ string, reqs []*wire.Request) error {
	for _, r := range reqs {
		cp := *r
		cp.Payload = append([]byte(nil), r.Payload...) // the caller may reuse its memory
		c.reqs = append(c.reqs, &cp)
	}
	return nil
}

func (c *capture) Cancel(context.Context, string, transport.Cancellation) (int, error) { return 0, nil }

// inputFile stores data as file "file-in" in a fresh disk store and
// returns the store and the file's size.
func inputFile(t *testing.T, data []byte) (*disk.Store, int64) {
	t.Helper()
	files, err := disk.Open(disk.Config{Dir: t.TempDir()})
	if err != nil {
		t.Fatal(err)
	}
	size, err := files.Put(context.Background(), "file-in", bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	return files, size
}

// The lines validation keeps are enqueued as reading the file again would
// enqueue them (a fresh job, and one resumed after its first chunk).
func TestEnqueueKeptLinesAsFromTheFile(t *testing.T) {
	const n = 2500
	var in bytes.Buffer
	for i := range n {
		fmt.Fprintf(&in, `{"custom_id":"c-%d \"\u00e9\"","method":"POST","url":"/v1/chat/completions","body":{"model":"m1","messages":[{"role":"user","content":"line %d\n"}]}}`+"\n", i, i)
		if i%700 == 0 {
			in.WriteString("\n   \n") // blank lines are skipped
		}
	}
	ctx := context.Background()
	files, size := inputFile(t, in.Bytes())
	run := func(keep bool, from int) []*wire.Request {
		st := &oneJobState{job: Job{ID: "batch_x", Endpoint: "/v1/chat/completions", InputFileID: "file-in", Status: StatusValidating, ExpiresAt: 4102444800},
			file: File{ID: "file-in", Bytes: size, Lines: strings.Count(in.String(), "\n")}}
		if !keep {
			st.file.Bytes = keepLinesBytes + 1
		}
		prod := &capture{}
		s, err := New(Config{Queue: "q"}, st, files, prod, nil)
		if err != nil {
			t.Fatal(err)
		}
		j, kept, err := s.validate(ctx, st.job)
		if err != nil || j.Status != StatusInProgress || j.Counts.Total != n {
			t.Fatalf("validate: %v, %s %+v %+v", err, j.Status, j.Counts, j.Errors)
		}
		if (kept != nil) != keep {
			t.Fatalf("validate kept %d lines, want kept=%v", len(kept), keep)
		}
		j.Enqueued = from
		if j, err = s.enqueue(ctx, j, kept); err != nil || j.Enqueued != n {
			t.Fatalf("enqueue: %v, enqueued %d", err, j.Enqueued)
		}
		return prod.reqs
	}
	for _, from := range []int{0, 1000} {
		kept, read := run(true, from), run(false, from)
		if len(kept) != n-from || len(read) != n-from {
			t.Fatalf("from %d: %d requests from the kept lines, %d from the file; want %d", from, len(kept), len(read), n-from)
		}
		for i := range kept {
			kept[i].Created = read[i].Created // "now" when enqueued: not compared
			if !reflect.DeepEqual(kept[i], read[i]) {
				t.Fatalf("from %d, request %d:\nkept %+v\nread %+v", from, i, kept[i], read[i])
			}
		}
		if want := requestID("batch_x", from); kept[0].ID != want || kept[0].Metadata["custom_id"] != `c-`+fmt.Sprint(from)+` "é"` {
			t.Errorf("from %d: first request %s %v, want %s", from, kept[0].ID, kept[0].Metadata, want)
		}
	}
}
