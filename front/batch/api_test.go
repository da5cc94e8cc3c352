package batch_test

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/sluice-io/sluice/front/batch"
	"github.com/sluice-io/sluice/front/filestore"
)

// The Batch API's requests as docs/batch.md states them: what creating a
// batch accepts and refuses, and the files endpoints.

// apiErrorOf reads OpenAI's error object of an answer: its type and param,
// and whether code is there (null).
func apiErrorOf(t *testing.T, obj map[string]any) (typ string, param any) {
	t.Helper()
	e, ok := obj["error"].(map[string]any)
	if !ok || e["message"] == "" {
		t.Fatalf("%v is not an OpenAI error", obj)
	}
	if code, ok := e["code"]; !ok || code != nil {
		t.Errorf("error code %v, want null", e["code"])
	}
	return fmt.Sprint(e["type"]), e["param"]
}

// TestCreateBatchLimits: the limits of a batch's creation, each at its
// bound (accepted) and past it (400 naming the parameter); nothing is
// created by a refused request.
func TestCreateBatchLimits(t *testing.T) {
	f := newFront(t, backends(t)[0].open(t), batch.Config{})
	f.putInput(t, 1)
	pairs := func(n int) string {
		var b strings.Builder
		for i := range n {
			if i > 0 {
				b.WriteByte(',')
			}
			fmt.Fprintf(&b, `"k%d":"v"`, i)
		}
		return "{" + b.String() + "}"
	}
	accepted := 0
	for _, c := range []struct {
		name   string
		body   string // with %s for the input file id
		param  any    // nil: accepted
		status int
	}{
		{"not JSON", `{"input_file_id":`, "", 400},
		{"endpoint", `{"input_file_id":"%s","endpoint":"/v1/images/generations","completion_window":"24h"}`, "endpoint", 400},
		{"no endpoint", `{"input_file_id":"%s","completion_window":"24h"}`, "endpoint", 400},
		{"window", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"48h"}`, "completion_window", 400},
		{"17 metadata pairs", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":` + pairs(17) + `}`, "metadata", 400},
		{"16 metadata pairs", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":` + pairs(16) + `}`, nil, 200},
		{"key of 65", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"` + strings.Repeat("k", 65) + `":"v"}}`, "metadata", 400},
		{"key of 64", `{"input_file_id":"%s","endpoint":"/v1/embeddings","completion_window":"24h","metadata":{"` + strings.Repeat("k", 64) + `":"v"}}`, nil, 200},
		{"value of 513", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","metadata":{"k":"` + strings.Repeat("v", 513) + `"}}`, "metadata", 400},
		{"value of 512", `{"input_file_id":"%s","endpoint":"/v1/responses","completion_window":"24h","metadata":{"k":"` + strings.Repeat("v", 512) + `"}}`, nil, 200},
		{"expiry anchor", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","output_expires_after":{"anchor":"now","seconds":3600}}`, "output_expires_after", 400},
		{"expiry of 3599s", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","output_expires_after":{"anchor":"created_at","seconds":3599}}`, "output_expires_after", 400},
		{"expiry of 3600s", `{"input_file_id":"%s","endpoint":"/v1/completions","completion_window":"24h","output_expires_after":{"anchor":"created_at","seconds":3600}}`, nil, 200},
		{"expiry of 30 days", `{"input_file_id":"%s","endpoint":"/v1/moderations","completion_window":"24h","output_expires_after":{"anchor":"created_at","seconds":2592000}}`, nil, 200},
		{"expiry past 30 days", `{"input_file_id":"%s","endpoint":"/v1/chat/completions","completion_window":"24h","output_expires_after":{"anchor":"created_at","seconds":2592001}}`, "output_expires_after", 400},
		{"no such file", `{"input_file_id":"file-none%s","endpoint":"/v1/chat/completions","completion_window":"24h"}`, "input_file_id", 400},
	} {
		t.Run(c.name, func(t *testing.T) {
			body := c.body
			if strings.Contains(body, "%s") {
				body = fmt.Sprintf(body, smInputID)
			}
			status, obj := f.do(t, http.MethodPost, "/v1/batches", body)
			if status != c.status {
				t.Fatalf("status %d, want %d: %v", status, c.status, obj)
			}
			if status == 200 {
				accepted++
				if obj["status"] != batch.StatusValidating || obj["object"] != "batch" || num(obj, "expires_at")-num(obj, "created_at") != 24*3600 {
					t.Errorf("created %v", obj)
				}
				return
			}
			typ, param := apiErrorOf(t, obj)
			if c.param == "" {
				c.param = nil
			}
			if typ != "invalid_request_error" || param != c.param {
				t.Errorf("error type %q param %v, want invalid_request_error, %v", typ, param, c.param)
			}
		})
	}
	if js, _, err := f.state.ListJobs(context.Background(), "", 100); err != nil || len(js) != accepted {
		t.Errorf("%d batches stored (%v), want the %d accepted", len(js), err, accepted)
	}
}

// multipartUpload posts the given parts (name → content; a name starting
// with "file" is a file part named "file") to /v1/files.
func multipartUpload(t *testing.T, f *front, parts ...[2]string) (int, map[string]any) {
	t.Helper()
	var body bytes.Buffer
	mw := multipart.NewWriter(&body)
	for _, p := range parts {
		if strings.HasPrefix(p[0], "file") {
			w, _ := mw.CreateFormFile("file", "in.jsonl")
			_, _ = io.WriteString(w, p[1])
		} else {
			_ = mw.WriteField(p[0], p[1])
		}
	}
	_ = mw.Close()
	return f.send(t, http.MethodPost, "/v1/files", mw.FormDataContentType(), &body)
}

// stored lists the ids the file store holds.
func (f *front) stored(t *testing.T) []string {
	t.Helper()
	var ids []string
	if err := f.files.List(context.Background(), func(id string, _ filestore.Info) error {
		ids = append(ids, id)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	return ids
}

// TestFilesAPI: uploads refused (no multipart, no file part, two file
// parts, another purpose, too large) leave nothing stored; an accepted
// one is retrieved, downloaded, listed (by purpose, in either order) and
// deleted with its content.
func TestFilesAPI(t *testing.T) {
	const limit = 200
	f := newFront(t, backends(t)[0].open(t), batch.Config{MaxFileBytes: limit, FileExpiry: 48 * time.Hour})
	for _, c := range []struct {
		name   string
		up     func() (int, map[string]any)
		status int
		param  string
	}{
		{"not multipart", func() (int, map[string]any) {
			return f.send(t, http.MethodPost, "/v1/files", "application/json", strings.NewReader(`{}`))
		}, 400, "file"},
		{"no file part", func() (int, map[string]any) { return multipartUpload(t, f, [2]string{"purpose", "batch"}) }, 400, "file"},
		{"two file parts", func() (int, map[string]any) {
			return multipartUpload(t, f, [2]string{"purpose", "batch"}, [2]string{"file1", "{}\n"}, [2]string{"file2", "{}\n"})
		}, 400, "file"},
		{"purpose fine-tune", func() (int, map[string]any) {
			return multipartUpload(t, f, [2]string{"purpose", "fine-tune"}, [2]string{"file", "{}\n"})
		}, 400, "purpose"},
		{"no purpose", func() (int, map[string]any) { return multipartUpload(t, f, [2]string{"file", "{}\n"}) }, 400, "purpose"},
		{"one byte too large", func() (int, map[string]any) {
			return multipartUpload(t, f, [2]string{"purpose", "batch"}, [2]string{"file", strings.Repeat("x", limit+1)})
		}, 413, "file"},
	} {
		t.Run(c.name, func(t *testing.T) {
			status, obj := c.up()
			if status != c.status {
				t.Fatalf("status %d, want %d: %v", status, c.status, obj)
			}
			if typ, param := apiErrorOf(t, obj); typ != "invalid_request_error" || param != c.param {
				t.Errorf("error type %q param %v, want %q", typ, param, c.param)
			}
			if ids := f.stored(t); len(ids) > 0 {
				t.Errorf("a refused upload left %v in the store", ids)
			}
		})
	}
	content := strings.Repeat("y", limit-1) + "\n"
	status, up := multipartUpload(t, f, [2]string{"purpose", "batch"}, [2]string{"file", content})
	id, _ := up["id"].(string)
	if status != 200 || up["object"] != "file" || num(up, "bytes") != limit || up["filename"] != "in.jsonl" || up["purpose"] != "batch" ||
		up["status"] != "processed" || num(up, "expires_at")-num(up, "created_at") != 48*3600 {
		t.Fatalf("upload at the limit = %d %v", status, up)
	}
	if status, got := f.do(t, http.MethodGet, "/v1/files/"+id, ""); status != 200 || got["id"] != id || num(got, "bytes") != limit {
		t.Errorf("retrieve = %d %v", status, got)
	}
	resp, err := http.Get(f.api.URL + "/v1/files/" + id + "/content")
	if err != nil {
		t.Fatal(err)
	}
	b, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	if resp.StatusCode != 200 || string(b) != content || !strings.Contains(resp.Header.Get("Content-Disposition"), `filename=in.jsonl`) {
		t.Errorf("content = %d %q, %q", resp.StatusCode, b, resp.Header.Get("Content-Disposition"))
	}
	// Listing by purpose and order, beside an output file.
	if err := f.state.PutFile(context.Background(), batch.File{ID: "file-zz-output", Purpose: "batch_output", Bytes: 1}); err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		query string
		want  []string
	}{
		{"", []string{"file-zz-output", id}},
		{"?order=asc", []string{id, "file-zz-output"}},
		{"?purpose=batch", []string{id}},
		{"?purpose=batch_output", []string{"file-zz-output"}},
		{"?limit=1", []string{"file-zz-output"}},
	} {
		_, list := f.do(t, http.MethodGet, "/v1/files"+c.query, "")
		data, _ := list["data"].([]any)
		var got []string
		for _, d := range data {
			got = append(got, fmt.Sprint(d.(map[string]any)["id"]))
		}
		if fmt.Sprint(got) != fmt.Sprint(c.want) || list["object"] != "list" || (list["has_more"] == true) != (c.query == "?limit=1") {
			t.Errorf("list%s = %v has_more %v, want %v", c.query, got, list["has_more"], c.want)
		}
	}
	for _, q := range []string{"?limit=0", "?limit=101", "?limit=x"} {
		if status, obj := f.do(t, http.MethodGet, "/v1/files"+q, ""); status != 400 {
			t.Errorf("list%s = %d %v, want 400", q, status, obj)
		}
		if status, _ := f.do(t, http.MethodGet, "/v1/batches"+q, ""); status != 400 {
			t.Errorf("batches%s = %d, want 400", q, status)
		}
	}
	// A record whose content is gone.
	if status, obj := f.do(t, http.MethodGet, "/v1/files/file-zz-output/content", ""); status != 404 {
		t.Errorf("content of a record without content = %d %v", status, obj)
	}
	if status, del := f.do(t, http.MethodDelete, "/v1/files/"+id, ""); status != 200 || del["deleted"] != true || del["id"] != id {
		t.Fatalf("delete = %d %v", status, del)
	}
	if ids := f.stored(t); len(ids) > 0 {
		t.Errorf("the deleted file's content is still stored: %v", ids)
	}
	for _, path := range []string{"/v1/files/" + id, "/v1/files/" + id + "/content"} {
		status, obj := f.do(t, http.MethodGet, path, "")
		if status != 404 {
			t.Errorf("GET %s after the delete = %d", path, status)
			continue
		}
		if _, param := apiErrorOf(t, obj); param != "file_id" {
			t.Errorf("GET %s: param %v", path, param)
		}
	}
	if status, _ := f.do(t, http.MethodDelete, "/v1/files/"+id, ""); status != 404 {
		t.Errorf("deleting again = %d, want 404", status)
	}
}
