package batch

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net/http"
	"slices"
	"strconv"
	"time"

	"github.com/sluice-io/sluice/front/filestore"
)

// Handler returns the HTTP API: /v1/files and /v1/batches as OpenAI
// defines them.
func (s *Service) Handler() http.Handler {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/files", s.uploadFile)
	mux.HandleFunc("GET /v1/files", s.listFiles)
	mux.HandleFunc("GET /v1/files/{id}", s.getFile)
	mux.HandleFunc("DELETE /v1/files/{id}", s.deleteFile)
	mux.HandleFunc("GET /v1/files/{id}/content", s.fileContent)
	mux.HandleFunc("POST /v1/batches", s.createBatch)
	mux.HandleFunc("GET /v1/batches", s.listBatches)
	mux.HandleFunc("GET /v1/batches/{id}", s.getBatch)
	mux.HandleFunc("POST /v1/batches/{id}/cancel", s.cancelBatch)
	return mux
}

// apiError writes OpenAI's error object.
func apiError(w http.ResponseWriter, status int, typ, param, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	var p any
	if param != "" {
		p = param
	}
	_ = json.NewEncoder(w).Encode(map[string]any{"error": map[string]any{"message": msg, "type": typ, "param": p, "code": nil}})
}

func invalid(w http.ResponseWriter, param, msg string) {
	apiError(w, http.StatusBadRequest, "invalid_request_error", param, msg)
}

func (s *Service) internal(w http.ResponseWriter, what string, err error) {
	s.log.Error("batch api: "+what, "err", err)
	apiError(w, http.StatusInternalServerError, "server_error", "", what+": "+err.Error())
}

func writeJSON(w http.ResponseWriter, v any) {
	w.Header().Set("Content-Type", "application/json")
	_ = json.NewEncoder(w).Encode(v)
}

// fileObject is OpenAI's File object.
func fileObject(f File) map[string]any {
	o := map[string]any{"id": f.ID, "object": "file", "bytes": f.Bytes, "created_at": f.CreatedAt,
		"filename": f.Filename, "purpose": f.Purpose, "status": "processed", "status_details": nil}
	if f.ExpiresAt > 0 {
		o["expires_at"] = f.ExpiresAt
	}
	return o
}

// countingReader counts and bounds what is read through it.
type countingReader struct {
	r     io.Reader
	n     int64
	limit int64
	lines int
	over  bool
}

func (c *countingReader) Read(p []byte) (int, error) {
	n, err := c.r.Read(p)
	c.n += int64(n)
	c.lines += bytes.Count(p[:n], []byte{'\n'})
	if c.n > c.limit {
		c.over = true
		return n, fmt.Errorf("file larger than %d bytes", c.limit)
	}
	return n, err
}

// uploadFile streams the multipart "file" part into the file store (never
// whole in memory), then checks purpose=batch.
func (s *Service) uploadFile(w http.ResponseWriter, r *http.Request) {
	ctx := r.Context()
	mr, err := r.MultipartReader()
	if err != nil {
		invalid(w, "file", "expected a multipart/form-data upload: "+err.Error())
		return
	}
	var purpose, filename string
	var stored *File
	cleanup := func() {
		if stored != nil {
			_ = s.files.Delete(context.WithoutCancel(ctx), stored.ID)
		}
	}
	for {
		part, err := mr.NextPart()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			cleanup()
			invalid(w, "file", "reading the upload: "+err.Error())
			return
		}
		switch part.FormName() {
		case "purpose":
			b, _ := io.ReadAll(io.LimitReader(part, 64))
			purpose = string(b)
		case "file":
			if stored != nil {
				cleanup()
				invalid(w, "file", "more than one file part")
				return
			}
			filename = part.FileName()
			id := newID("file-")
			cr := &countingReader{r: part, limit: s.cfg.MaxFileBytes}
			size, err := s.files.Put(ctx, id, cr)
			if err != nil {
				_ = s.files.Delete(context.WithoutCancel(ctx), id)
				if cr.over {
					apiError(w, http.StatusRequestEntityTooLarge, "invalid_request_error", "file",
						fmt.Sprintf("The file exceeds the maximum of %d bytes.", s.cfg.MaxFileBytes))
					return
				}
				s.internal(w, "storing the file", err)
				return
			}
			stored = &File{ID: id, Bytes: size, Filename: filename, Lines: cr.lines}
		}
		_ = part.Close()
	}
	if stored == nil {
		invalid(w, "file", "the upload has no file part")
		return
	}
	if purpose != "batch" {
		cleanup()
		invalid(w, "purpose", fmt.Sprintf("purpose %q is not supported here: only \"batch\"", purpose))
		return
	}
	now := time.Now()
	stored.CreatedAt, stored.Purpose, stored.ExpiresAt = now.Unix(), purpose, now.Add(s.cfg.FileExpiry).Unix()
	if err := s.state.PutFile(ctx, *stored); err != nil {
		cleanup()
		s.internal(w, "recording the file", err)
		return
	}
	writeJSON(w, fileObject(*stored))
}

// page reads after and limit (1-100, default 20) as OpenAI's lists do.
func page(w http.ResponseWriter, r *http.Request) (string, int, bool) {
	limit := 20
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 100 {
			invalid(w, "limit", "limit must be an integer from 1 to 100")
			return "", 0, false
		}
		limit = n
	}
	return r.URL.Query().Get("after"), limit, true
}

func listObject(data []map[string]any, more bool) map[string]any {
	o := map[string]any{"object": "list", "data": data, "has_more": more, "first_id": nil, "last_id": nil}
	if len(data) > 0 {
		o["first_id"], o["last_id"] = data[0]["id"], data[len(data)-1]["id"]
	}
	return o
}

func (s *Service) listFiles(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := page(w, r)
	if !ok {
		return
	}
	purpose := r.URL.Query().Get("purpose")
	var data []map[string]any
	more := false
pages:
	for {
		fs, m, err := s.state.ListFiles(r.Context(), after, limit)
		if err != nil {
			s.internal(w, "listing files", err)
			return
		}
		for _, f := range fs {
			after = f.ID
			if purpose != "" && f.Purpose != purpose {
				continue
			}
			if len(data) == limit {
				more = true
				break pages
			}
			data = append(data, fileObject(f))
		}
		if !m {
			break
		}
		if len(data) == limit {
			more = true // more files follow (with a purpose filter, perhaps none of it)
			break
		}
	}
	if r.URL.Query().Get("order") == "asc" {
		slices.Reverse(data)
	}
	writeJSON(w, listObject(data, more))
}

func (s *Service) file(w http.ResponseWriter, r *http.Request) (File, bool) {
	f, err := s.state.GetFile(r.Context(), r.PathValue("id"))
	if errors.Is(err, ErrNotFound) {
		apiError(w, http.StatusNotFound, "invalid_request_error", "file_id", "No such File object: "+r.PathValue("id"))
		return f, false
	}
	if err != nil {
		s.internal(w, "reading the file", err)
		return f, false
	}
	return f, true
}

func (s *Service) getFile(w http.ResponseWriter, r *http.Request) {
	if f, ok := s.file(w, r); ok {
		writeJSON(w, fileObject(f))
	}
}

func (s *Service) deleteFile(w http.ResponseWriter, r *http.Request) {
	f, ok := s.file(w, r)
	if !ok {
		return
	}
	if err := s.deleteFileID(r.Context(), f.ID); err != nil {
		s.internal(w, "deleting the file", err)
		return
	}
	writeJSON(w, map[string]any{"id": f.ID, "object": "file", "deleted": true})
}

func (s *Service) deleteFileID(ctx context.Context, id string) error {
	if err := s.state.DeleteFile(ctx, id); err != nil {
		return err
	}
	return s.files.Delete(ctx, id)
}

func (s *Service) fileContent(w http.ResponseWriter, r *http.Request) {
	f, ok := s.file(w, r)
	if !ok {
		return
	}
	rc, err := s.files.Open(r.Context(), f.ID, 0)
	if errors.Is(err, filestore.ErrNotFound) {
		apiError(w, http.StatusNotFound, "invalid_request_error", "file_id", "The content of "+f.ID+" is gone.")
		return
	}
	if err != nil {
		s.internal(w, "opening the file", err)
		return
	}
	defer rc.Close()
	w.Header().Set("Content-Type", "application/octet-stream")
	w.Header().Set("Content-Length", strconv.FormatInt(f.Bytes, 10))
	w.Header().Set("Content-Disposition", mime.FormatMediaType("attachment", map[string]string{"filename": f.Filename}))
	_, _ = io.Copy(w, rc)
}

// batchObject is OpenAI's Batch object.
func batchObject(j Job) map[string]any {
	o := map[string]any{"id": j.ID, "object": "batch", "endpoint": j.Endpoint, "input_file_id": j.InputFileID,
		"completion_window": j.CompletionWindow, "status": j.Status, "created_at": j.CreatedAt,
		"request_counts": j.Counts, "metadata": j.Metadata, "errors": nil,
		"output_file_id": nil, "error_file_id": nil}
	if j.Model != "" {
		o["model"] = j.Model
	}
	if j.Usage != nil {
		o["usage"] = j.Usage
	} else {
		o["usage"] = Usage{}
	}
	if j.OutputFileID != "" {
		o["output_file_id"] = j.OutputFileID
	}
	if j.ErrorFileID != "" {
		o["error_file_id"] = j.ErrorFileID
	}
	if len(j.Errors) > 0 {
		o["errors"] = map[string]any{"object": "list", "data": j.Errors}
	}
	for k, v := range map[string]int64{"in_progress_at": j.InProgressAt, "expires_at": j.ExpiresAt, "finalizing_at": j.FinalizingAt,
		"completed_at": j.CompletedAt, "failed_at": j.FailedAt, "expired_at": j.ExpiredAt, "cancelling_at": j.CancellingAt, "cancelled_at": j.CancelledAt} {
		if v != 0 {
			o[k] = v
		} else {
			o[k] = nil
		}
	}
	return o
}

// endpoints are the batch endpoints accepted (OpenAI's text ones that a
// gateway serves).
var endpoints = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses", "/v1/moderations"}

func (s *Service) createBatch(w http.ResponseWriter, r *http.Request) {
	var req struct {
		InputFileID        string            `json:"input_file_id"`
		Endpoint           string            `json:"endpoint"`
		CompletionWindow   string            `json:"completion_window"`
		Metadata           map[string]string `json:"metadata"`
		OutputExpiresAfter *struct {
			Anchor  string `json:"anchor"`
			Seconds int64  `json:"seconds"`
		} `json:"output_expires_after"`
	}
	if err := json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&req); err != nil {
		invalid(w, "", "the body is not a JSON object: "+err.Error())
		return
	}
	if !slices.Contains(endpoints, req.Endpoint) {
		invalid(w, "endpoint", fmt.Sprintf("endpoint %q is not supported (one of %v)", req.Endpoint, endpoints))
		return
	}
	if !slices.Contains(s.cfg.Windows, req.CompletionWindow) {
		invalid(w, "completion_window", fmt.Sprintf("completion_window %q is not supported (one of %v)", req.CompletionWindow, s.cfg.Windows))
		return
	}
	window, _ := time.ParseDuration(req.CompletionWindow)
	if len(req.Metadata) > 16 {
		invalid(w, "metadata", "metadata holds at most 16 pairs")
		return
	}
	for k, v := range req.Metadata {
		if len(k) > 64 || len(v) > 512 {
			invalid(w, "metadata", "metadata keys are at most 64 characters, values at most 512")
			return
		}
	}
	var outExp int64
	if e := req.OutputExpiresAfter; e != nil {
		if e.Anchor != "created_at" || e.Seconds < 3600 || e.Seconds > 2592000 {
			invalid(w, "output_expires_after", "output_expires_after needs anchor \"created_at\" and seconds from 3600 to 2592000")
			return
		}
		outExp = e.Seconds
	}
	f, err := s.state.GetFile(r.Context(), req.InputFileID)
	if errors.Is(err, ErrNotFound) {
		invalid(w, "input_file_id", "No such File object: "+req.InputFileID)
		return
	}
	if err != nil {
		s.internal(w, "reading the input file", err)
		return
	}
	if f.Purpose != "batch" {
		invalid(w, "input_file_id", "the input file's purpose is "+f.Purpose+", not batch")
		return
	}
	now := time.Now()
	j := Job{ID: newID("batch_"), Endpoint: req.Endpoint, InputFileID: f.ID, CompletionWindow: req.CompletionWindow,
		Status: StatusValidating, Metadata: req.Metadata, OutputExpiresAfter: outExp,
		CreatedAt: now.Unix(), ExpiresAt: now.Add(window).Unix()}
	if err := s.state.CreateJob(r.Context(), j); err != nil {
		s.internal(w, "creating the batch", err)
		return
	}
	s.wake()
	writeJSON(w, batchObject(j))
}

func (s *Service) getBatch(w http.ResponseWriter, r *http.Request) {
	j, err := s.state.GetJob(r.Context(), r.PathValue("id"))
	if errors.Is(err, ErrNotFound) {
		apiError(w, http.StatusNotFound, "invalid_request_error", "batch_id", "No such Batch object: "+r.PathValue("id"))
		return
	}
	if err != nil {
		s.internal(w, "reading the batch", err)
		return
	}
	writeJSON(w, batchObject(j))
}

func (s *Service) listBatches(w http.ResponseWriter, r *http.Request) {
	after, limit, ok := page(w, r)
	if !ok {
		return
	}
	js, more, err := s.state.ListJobs(r.Context(), after, limit)
	if err != nil {
		s.internal(w, "listing batches", err)
		return
	}
	data := make([]map[string]any, len(js))
	for i, j := range js {
		data[i] = batchObject(j)
	}
	writeJSON(w, listObject(data, more))
}

// cancelBatch moves a batch to cancelling; its owner cancels it on the
// queue and finishes it as cancelled. A final batch cannot be cancelled.
func (s *Service) cancelBatch(w http.ResponseWriter, r *http.Request) {
	var final string
	j, err := s.state.UpdateJob(r.Context(), r.PathValue("id"), func(j *Job) error {
		if Final(j.Status) {
			final = j.Status
			return nil
		}
		if j.Status != StatusCancelling {
			j.Status, j.CancellingAt = StatusCancelling, time.Now().Unix()
		}
		return nil
	})
	if errors.Is(err, ErrNotFound) {
		apiError(w, http.StatusNotFound, "invalid_request_error", "batch_id", "No such Batch object: "+r.PathValue("id"))
		return
	}
	if err != nil {
		s.internal(w, "cancelling the batch", err)
		return
	}
	if final != "" && final != StatusCancelled {
		apiError(w, http.StatusConflict, "invalid_request_error", "", "Cannot cancel a batch with status "+final+".")
		return
	}
	writeJSON(w, batchObject(j))
}
