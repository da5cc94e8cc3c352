// Package filestoretest is the conformance suite every filestore backend
// passes: Run drives a filestore.Store through its contract (put, open from
// an offset, stat, delete, not-found, replace, concurrent puts, a large file
// streamed through, no partial file under a final id, id validation and,
// where the backend lists, List) with Features saying what each promises.
package filestoretest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"runtime"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/sluice-io/sluice/front/filestore"
)

// Features say what a backend promises; the suite checks exactly these.
type Features struct {
	// LargeSize is the size of the file the streaming test puts and reads
	// back (default 48 MiB).
	LargeSize int64
	// HeapBound, when > 0, is how much the process heap may grow while the
	// large file is put: a backend that streams stays far below the file's
	// size. Leave it 0 for a backend tested against an in-process fake
	// server that holds objects in memory, since the fake's heap is the
	// test's heap and the check would measure the fake.
	HeapBound int64
	// WrittenSlack is how far Info.Written may lie outside the time span
	// of the Put (default 2 s; object stores keep whole seconds).
	WrittenSlack time.Duration
}

// New returns a store for one subtest: empty, and closed (if it must be)
// by the test's cleanup.
type New func(t *testing.T) filestore.Store

// Run runs the suite; each subtest gets its own store from newStore.
func Run(t *testing.T, newStore New, f Features) {
	if f.LargeSize <= 0 {
		f.LargeSize = 48 << 20
	}
	if f.WrittenSlack <= 0 {
		f.WrittenSlack = 2 * time.Second
	}
	t.Run("PutOpenStat", func(t *testing.T) { testPutOpenStat(t, newStore(t), f) })
	t.Run("Empty", func(t *testing.T) { testEmpty(t, newStore(t)) })
	t.Run("Offset", func(t *testing.T) { testOffset(t, newStore(t)) })
	t.Run("NotFound", func(t *testing.T) { testNotFound(t, newStore(t)) })
	t.Run("Delete", func(t *testing.T) { testDelete(t, newStore(t)) })
	t.Run("Replace", func(t *testing.T) { testReplace(t, newStore(t)) })
	t.Run("InvalidIDs", func(t *testing.T) { testInvalidIDs(t, newStore(t)) })
	t.Run("ConcurrentPuts", func(t *testing.T) { testConcurrentPuts(t, newStore(t)) })
	t.Run("NoPartialFile", func(t *testing.T) { testNoPartialFile(t, newStore(t)) })
	t.Run("CancelledPut", func(t *testing.T) { testCancelledPut(t, newStore(t)) })
	t.Run("LargeStreamed", func(t *testing.T) { testLarge(t, newStore(t), f) })
	t.Run("List", func(t *testing.T) { testList(t, newStore(t)) })
}

func ctxT(t *testing.T) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	t.Cleanup(cancel)
	return ctx
}

func put(t *testing.T, s filestore.Store, id string, data []byte) {
	t.Helper()
	n, err := s.Put(ctxT(t), id, bytes.NewReader(data))
	if err != nil {
		t.Fatalf("Put %s: %v", id, err)
	}
	if n != int64(len(data)) {
		t.Fatalf("Put %s returned size %d, want %d", id, n, len(data))
	}
}

func read(t *testing.T, s filestore.Store, id string, offset int64) []byte {
	t.Helper()
	rc, err := s.Open(ctxT(t), id, offset)
	if err != nil {
		t.Fatalf("Open %s at %d: %v", id, offset, err)
	}
	defer rc.Close()
	b, err := io.ReadAll(rc)
	if err != nil {
		t.Fatalf("read %s at %d: %v", id, offset, err)
	}
	return b
}

func testPutOpenStat(t *testing.T, s filestore.Store, f Features) {
	data := []byte(`{"custom_id":"a","method":"POST","url":"/v1/chat/completions","body":{}}` + "\n")
	before := time.Now()
	put(t, s, "file-put", data)
	after := time.Now()
	if got := read(t, s, "file-put", 0); !bytes.Equal(got, data) {
		t.Fatalf("Open returned %q, want %q", got, data)
	}
	info, err := s.Stat(ctxT(t), "file-put")
	if err != nil {
		t.Fatalf("Stat: %v", err)
	}
	if info.Size != int64(len(data)) {
		t.Fatalf("Stat size %d, want %d", info.Size, len(data))
	}
	if info.Written.Before(before.Add(-f.WrittenSlack)) || info.Written.After(after.Add(f.WrittenSlack)) {
		t.Fatalf("Stat written %v, not within %v of the put (%v .. %v)", info.Written, f.WrittenSlack, before, after)
	}
}

func testEmpty(t *testing.T, s filestore.Store) {
	put(t, s, "file-empty", nil)
	if got := read(t, s, "file-empty", 0); len(got) != 0 {
		t.Fatalf("empty file read back as %q", got)
	}
	info, err := s.Stat(ctxT(t), "file-empty")
	if err != nil || info.Size != 0 {
		t.Fatalf("Stat of empty file: %+v, %v", info, err)
	}
}

func testOffset(t *testing.T, s filestore.Store) {
	data := []byte("0123456789abcdefghij")
	put(t, s, "file-offset", data)
	for _, off := range []int64{0, 1, 10, 19, 20} {
		if got := read(t, s, "file-offset", off); !bytes.Equal(got, data[off:]) {
			t.Fatalf("Open at %d returned %q, want %q", off, got, data[off:])
		}
	}
	for _, off := range []int64{-1, 21, 1000} {
		rc, err := s.Open(ctxT(t), "file-offset", off)
		if err == nil {
			rc.Close()
			t.Fatalf("Open at offset %d of a 20-byte file: no error", off)
		}
		if errors.Is(err, filestore.ErrNotFound) {
			t.Fatalf("Open at offset %d: %v; a bad offset is not ErrNotFound", off, err)
		}
	}
}

func testNotFound(t *testing.T, s filestore.Store) {
	ctx := ctxT(t)
	if _, err := s.Open(ctx, "file-missing", 0); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Open of a missing id: %v, want ErrNotFound", err)
	}
	if _, err := s.Stat(ctx, "file-missing"); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Stat of a missing id: %v, want ErrNotFound", err)
	}
	if err := s.Delete(ctx, "file-missing"); err != nil {
		t.Fatalf("Delete of a missing id: %v, want nil", err)
	}
}

func testDelete(t *testing.T, s filestore.Store) {
	put(t, s, "file-del", []byte("x"))
	put(t, s, "file-keep", []byte("y"))
	if err := s.Delete(ctxT(t), "file-del"); err != nil {
		t.Fatalf("Delete: %v", err)
	}
	if _, err := s.Stat(ctxT(t), "file-del"); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Stat after Delete: %v, want ErrNotFound", err)
	}
	if _, err := s.Open(ctxT(t), "file-del", 0); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Open after Delete: %v, want ErrNotFound", err)
	}
	if got := read(t, s, "file-keep", 0); string(got) != "y" {
		t.Fatalf("Delete of one id changed another: %q", got)
	}
	if err := s.Delete(ctxT(t), "file-del"); err != nil {
		t.Fatalf("second Delete: %v", err)
	}
}

func testReplace(t *testing.T, s filestore.Store) {
	put(t, s, "file-rep", []byte("first version, longer"))
	put(t, s, "file-rep", []byte("second"))
	if got := read(t, s, "file-rep", 0); string(got) != "second" {
		t.Fatalf("after replace read %q, want %q", got, "second")
	}
	info, err := s.Stat(ctxT(t), "file-rep")
	if err != nil || info.Size != 6 {
		t.Fatalf("Stat after replace: %+v, %v", info, err)
	}
}

func testInvalidIDs(t *testing.T, s filestore.Store) {
	ctx := ctxT(t)
	for _, id := range []string{"", ".", "..", "../escape", "a/b", "/abs", ".hidden", "a\\b", "sp ace", "nul\x00", strings.Repeat("x", filestore.MaxIDLen+1)} {
		if _, err := s.Put(ctx, id, strings.NewReader("x")); err == nil {
			t.Fatalf("Put accepted id %q", id)
		}
		if _, err := s.Open(ctx, id, 0); err == nil {
			t.Fatalf("Open accepted id %q", id)
		}
		if _, err := s.Stat(ctx, id); err == nil {
			t.Fatalf("Stat accepted id %q", id)
		}
		if err := s.Delete(ctx, id); err == nil {
			t.Fatalf("Delete accepted id %q", id)
		}
	}
	put(t, s, "Batch_output-01.jsonl", []byte("ok"))
	if got := read(t, s, "Batch_output-01.jsonl", 0); string(got) != "ok" {
		t.Fatalf("read %q", got)
	}
}

// content is a deterministic body for writer w of a concurrency test.
func content(w, size int) []byte {
	b := make([]byte, size)
	for i := range b {
		b[i] = byte('a' + (w+i)%26)
	}
	return b
}

func testConcurrentPuts(t *testing.T, s filestore.Store) {
	const writers = 8
	const size = 256 << 10
	var wg sync.WaitGroup
	errs := make(chan error, 2*writers)
	for w := range writers {
		wg.Go(func() {
			if _, err := s.Put(ctxT(t), fmt.Sprintf("file-own-%d", w), bytes.NewReader(content(w, size))); err != nil {
				errs <- fmt.Errorf("writer %d own id: %w", w, err)
			}
			if _, err := s.Put(ctxT(t), "file-shared", bytes.NewReader(content(w, size))); err != nil {
				errs <- fmt.Errorf("writer %d shared id: %w", w, err)
			}
		})
	}
	wg.Wait()
	close(errs)
	for err := range errs {
		t.Fatal(err)
	}
	for w := range writers {
		if got := read(t, s, fmt.Sprintf("file-own-%d", w), 0); !bytes.Equal(got, content(w, size)) {
			t.Fatalf("file-own-%d: content of %d bytes does not match what writer %d put", w, len(got), w)
		}
	}
	got := read(t, s, "file-shared", 0)
	whole := slices.ContainsFunc([]int{0, 1, 2, 3, 4, 5, 6, 7}, func(w int) bool { return bytes.Equal(got, content(w, size)) })
	if !whole {
		t.Fatalf("file-shared (%d bytes) is not any one writer's whole content: writes were mixed", len(got))
	}
}

// stalling yields first, then blocks until release is closed, then fails.
type stalling struct {
	first   []byte
	reached chan struct{}
	release chan struct{}
	once    sync.Once
}

var errStalled = errors.New("source failed mid-file")

func (r *stalling) Read(p []byte) (int, error) {
	if len(r.first) > 0 {
		n := copy(p, r.first)
		r.first = r.first[n:]
		return n, nil
	}
	r.once.Do(func() { close(r.reached) })
	<-r.release
	return 0, errStalled
}

func testNoPartialFile(t *testing.T, s filestore.Store) {
	for _, existing := range []bool{false, true} {
		t.Run(fmt.Sprintf("existing=%v", existing), func(t *testing.T) {
			id := fmt.Sprintf("file-partial-%v", existing)
			old := []byte("the old whole file")
			if existing {
				put(t, s, id, old)
			}
			src := &stalling{first: bytes.Repeat([]byte("p"), 1<<20), reached: make(chan struct{}), release: make(chan struct{})}
			done := make(chan error, 1)
			go func() {
				_, err := s.Put(ctxT(t), id, src)
				done <- err
			}()
			select {
			case <-src.reached:
			case err := <-done:
				t.Fatalf("Put returned before its source was drained: %v", err)
			case <-time.After(time.Minute):
				t.Fatal("Put did not read its source within a minute")
			}
			check := func(when string) {
				info, err := s.Stat(ctxT(t), id)
				if existing {
					if err != nil || info.Size != int64(len(old)) {
						t.Fatalf("%s: Stat %+v, %v; want the old file of %d bytes", when, info, err, len(old))
					}
					if got := read(t, s, id, 0); !bytes.Equal(got, old) {
						t.Fatalf("%s: read %d bytes, want the old file", when, len(got))
					}
				} else if !errors.Is(err, filestore.ErrNotFound) {
					t.Fatalf("%s: Stat %+v, %v; want ErrNotFound", when, info, err)
				}
			}
			check("while Put is half-way")
			close(src.release)
			if err := <-done; err == nil {
				t.Fatal("Put of a source that failed returned no error")
			}
			check("after a failed Put")
			if l, ok := s.(filestore.Lister); ok {
				ids := listIDs(t, l)
				for _, got := range ids {
					if got != id && got != "file-partial-true" && got != "file-partial-false" {
						t.Fatalf("List shows %q after a failed Put (a temporary file?): %v", got, ids)
					}
				}
			}
		})
	}
}

func testCancelledPut(t *testing.T, s filestore.Store) {
	ctx, cancel := context.WithCancel(ctxT(t))
	src := &stalling{first: bytes.Repeat([]byte("c"), 1<<20), reached: make(chan struct{}), release: make(chan struct{})}
	done := make(chan error, 1)
	go func() {
		_, err := s.Put(ctx, "file-cancelled", src)
		done <- err
	}()
	select {
	case <-src.reached:
	case <-time.After(time.Minute):
		t.Fatal("Put did not read its source within a minute")
	}
	cancel()
	close(src.release)
	if err := <-done; err == nil {
		t.Fatal("cancelled Put returned no error")
	}
	if _, err := s.Stat(ctxT(t), "file-cancelled"); !errors.Is(err, filestore.ErrNotFound) {
		t.Fatalf("Stat after a cancelled Put: %v, want ErrNotFound", err)
	}
}

// pattern is a reader of n deterministic bytes that never holds more than
// one small block, and samples the heap as it goes.
type pattern struct {
	n, off   int64
	block    []byte
	sampled  int64
	peakHeap uint64
	sample   bool
}

func newPattern(n int64, sample bool) *pattern {
	// 64 KiB + 251: a period that no part or buffer size divides.
	b := make([]byte, 64<<10+251)
	for i := range b {
		b[i] = byte(i*131 + i/251)
	}
	return &pattern{n: n, block: b, sample: sample}
}

// at is the pattern from offset off to the end of its period: the byte at
// offset o is always block[o % len(block)], however the reads are cut.
func (p *pattern) at(off int64) []byte {
	return p.block[off%int64(len(p.block)):]
}

func (p *pattern) Read(b []byte) (int, error) {
	if p.off >= p.n {
		return 0, io.EOF
	}
	chunk := p.at(p.off)
	if rest := p.n - p.off; int64(len(chunk)) > rest {
		chunk = chunk[:rest]
	}
	n := copy(b, chunk)
	p.off += int64(n)
	if p.sample && p.off-p.sampled >= 1<<20 {
		p.sampled = p.off
		var ms runtime.MemStats
		runtime.ReadMemStats(&ms)
		p.peakHeap = max(p.peakHeap, ms.HeapInuse)
	}
	return n, nil
}

// verify reads r to its end and checks it is the pattern from offset start.
func verify(t *testing.T, r io.Reader, start, n int64) {
	t.Helper()
	want := newPattern(n, false)
	want.off = start
	buf := make([]byte, 256<<10)
	wbuf := make([]byte, 256<<10)
	off := start
	for {
		k, err := io.ReadFull(r, buf)
		if k > 0 {
			if _, werr := io.ReadFull(want, wbuf[:k]); werr != nil {
				t.Fatalf("file is longer than %d bytes (at %d)", n, off)
			}
			if !bytes.Equal(buf[:k], wbuf[:k]) {
				t.Fatalf("large file differs in the %d bytes from offset %d", k, off)
			}
			off += int64(k)
		}
		if err == io.EOF || err == io.ErrUnexpectedEOF {
			break
		}
		if err != nil {
			t.Fatalf("read at %d: %v", off, err)
		}
	}
	if off != n {
		t.Fatalf("read %d bytes, want %d", off, n)
	}
}

func testLarge(t *testing.T, s filestore.Store, f Features) {
	src := newPattern(f.LargeSize, f.HeapBound > 0)
	var base runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&base)
	n, err := s.Put(ctxT(t), "file-large", src)
	if err != nil {
		t.Fatalf("Put of %d bytes: %v", f.LargeSize, err)
	}
	if n != f.LargeSize {
		t.Fatalf("Put returned size %d, want %d", n, f.LargeSize)
	}
	if f.HeapBound > 0 {
		grew := int64(src.peakHeap) - int64(base.HeapInuse)
		t.Logf("heap in use grew by %d KiB while putting %d MiB", grew>>10, f.LargeSize>>20)
		if grew > f.HeapBound {
			t.Fatalf("heap grew by %d bytes while putting %d bytes (bound %d): the backend holds the file in memory", grew, f.LargeSize, f.HeapBound)
		}
	}
	info, err := s.Stat(ctxT(t), "file-large")
	if err != nil || info.Size != f.LargeSize {
		t.Fatalf("Stat: %+v, %v; want size %d", info, err, f.LargeSize)
	}
	for _, off := range []int64{0, f.LargeSize/2 + 12345, f.LargeSize - 3} {
		rc, err := s.Open(ctxT(t), "file-large", off)
		if err != nil {
			t.Fatalf("Open at %d: %v", off, err)
		}
		verify(t, rc, off, f.LargeSize)
		rc.Close()
	}
}

func listIDs(t *testing.T, l filestore.Lister) []string {
	t.Helper()
	var ids []string
	err := l.List(ctxT(t), func(id string, info filestore.Info) error {
		ids = append(ids, id)
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	slices.Sort(ids)
	return ids
}

func testList(t *testing.T, s filestore.Store) {
	l, ok := s.(filestore.Lister)
	if !ok {
		t.Skip("backend does not implement filestore.Lister")
	}
	if ids := listIDs(t, l); len(ids) != 0 {
		t.Fatalf("List of a new store: %v, want none", ids)
	}
	put(t, s, "file-l1", []byte("1"))
	put(t, s, "file-l2", []byte("22"))
	put(t, s, "file-l3", []byte("333"))
	if err := s.Delete(ctxT(t), "file-l3"); err != nil {
		t.Fatal(err)
	}
	sizes := map[string]int64{}
	err := l.List(ctxT(t), func(id string, info filestore.Info) error {
		sizes[id] = info.Size
		if info.Written.IsZero() {
			return fmt.Errorf("list gave %s a zero written time", id)
		}
		return nil
	})
	if err != nil {
		t.Fatalf("List: %v", err)
	}
	if len(sizes) != 2 || sizes["file-l1"] != 1 || sizes["file-l2"] != 2 {
		t.Fatalf("List: %v, want file-l1:1 file-l2:2", sizes)
	}
	stop := errors.New("stop")
	calls := 0
	err = l.List(ctxT(t), func(string, filestore.Info) error { calls++; return stop })
	if !errors.Is(err, stop) || calls != 1 {
		t.Fatalf("List whose fn failed: %v after %d calls, want fn's error after 1", err, calls)
	}
}

// FailingReader yields n zero bytes, then fails with "source broke": a
// Put's source that breaks after its first parts, for a backend's own
// tests of what a failed multipart or resumable upload leaves.
func FailingReader(n int) io.Reader { return &failing{n: n} }

type failing struct{ n int }

func (r *failing) Read(p []byte) (int, error) {
	if r.n == 0 {
		return 0, errors.New("source broke")
	}
	k := min(len(p), r.n)
	clear(p[:k])
	r.n -= k
	return k, nil
}
