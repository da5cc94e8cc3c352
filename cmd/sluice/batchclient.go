package main

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime/multipart"
	"net/http"
	"net/textproto"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/cenkalti/backoff/v5"
)

// The OpenAI Batch API as `sluice batch` speaks it: the five calls it
// makes and the part of the Batch object it reads, over net/http. (The
// official Go client, which the front's tests drive the API with, is
// about a fifth of the binary's code for these few calls.)

// The statuses of a batch.
const (
	batchValidating = "validating"
	batchInProgress = "in_progress"
	batchFinalizing = "finalizing"
	batchCompleted  = "completed"
	batchFailed     = "failed"
	batchExpired    = "expired"
	batchCancelling = "cancelling"
	batchCancelled  = "cancelled"
)

// batchObject is the OpenAI Batch object, the fields the commands show.
type batchObject struct {
	ID               string            `json:"id"`
	Status           string            `json:"status"`
	Endpoint         string            `json:"endpoint"`
	CompletionWindow string            `json:"completion_window"`
	InputFileID      string            `json:"input_file_id"`
	OutputFileID     string            `json:"output_file_id"`
	ErrorFileID      string            `json:"error_file_id"`
	Metadata         map[string]string `json:"metadata"`
	Errors           struct {
		Data []batchLineError `json:"data"`
	} `json:"errors"`
	RequestCounts struct {
		Total     int64 `json:"total"`
		Completed int64 `json:"completed"`
		Failed    int64 `json:"failed"`
	} `json:"request_counts"`
	CreatedAt    int64 `json:"created_at"`
	InProgressAt int64 `json:"in_progress_at"`
	FinalizingAt int64 `json:"finalizing_at"`
	CompletedAt  int64 `json:"completed_at"`
	FailedAt     int64 `json:"failed_at"`
	CancellingAt int64 `json:"cancelling_at"`
	CancelledAt  int64 `json:"cancelled_at"`
	ExpiredAt    int64 `json:"expired_at"`
	ExpiresAt    int64 `json:"expires_at"`

	raw []byte // the object as the API returned it
}

// batchLineError is one entry of a batch's errors.
type batchLineError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
	Line    int64  `json:"line"`
}

// apiError is an answer other than 2xx: its status and the API's message
// ("" when the body held none, as when something else answered).
type apiError struct {
	StatusCode int
	Message    string
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s", e.StatusCode, e.Message) }

// batchClient talks to a Batch API at base (".../v1/").
type batchClient struct {
	api  string // the base URL, as given
	base string // api with "/v1/"
	key  string
	hc   *http.Client
}

func newBatchClient(api string) (*batchClient, error) {
	api = strings.TrimRight(strings.TrimSpace(api), "/")
	if !strings.HasPrefix(api, "http://") && !strings.HasPrefix(api, "https://") {
		return nil, fmt.Errorf("--api %q: want an http(s) URL such as %s", api, defaultBatchAPI)
	}
	return &batchClient{
		api:  api,
		base: strings.TrimSuffix(api, "/v1") + "/v1/",
		key:  os.Getenv("OPENAI_API_KEY"), // sluice's Batch API takes none; another one may
		hc:   &http.Client{},
	}, nil
}

// retryable reports whether an answer with status code may succeed when
// the call is made again (the statuses OpenAI's clients retry).
func retryable(code int) bool {
	return code == http.StatusRequestTimeout || code == http.StatusConflict || code == http.StatusTooManyRequests || code >= 500
}

// call makes one API call: method on path (relative to base) with the
// body body builds (nil: none), made once more callRetryWait after a
// connection error or a retryable status. It returns the response of a
// 2xx answer, whose body the caller closes, or an *apiError.
func (c *batchClient) call(ctx context.Context, method, path string, body func() (io.Reader, string, error)) (*http.Response, error) {
	var last error // the last attempt's failure
	attempt := func() (*http.Response, error) {
		resp, retry, err := c.attempt(ctx, method, path, body)
		last = err
		if err != nil && !retry {
			return nil, backoff.Permanent(err)
		}
		return resp, err
	}
	resp, err := backoff.Retry(ctx, attempt, backoff.WithBackOff(backoff.NewConstantBackOff(callRetryWait)),
		backoff.WithMaxTries(callTries), backoff.WithMaxElapsedTime(0))
	if err != nil && !errors.Is(err, last) { // ctx ended before the next attempt
		return nil, ctx.Err()
	}
	return resp, err
}

// A call is made callTries times at most, callRetryWait apart.
const (
	callTries     = 2
	callRetryWait = 500 * time.Millisecond
)

// attempt makes one attempt of a call and says whether its failure may
// pass when made again.
func (c *batchClient) attempt(ctx context.Context, method, path string, body func() (io.Reader, string, error)) (resp *http.Response, retry bool, err error) {
	req, err := http.NewRequestWithContext(ctx, method, c.base+path, nil)
	if err != nil {
		return nil, false, err
	}
	if body != nil {
		rd, ctype, err := body()
		if err != nil {
			return nil, false, err
		}
		// A pipe's reader is closed by the transport whatever happens,
		// which ends its writer.
		rc, ok := rd.(io.ReadCloser)
		if !ok {
			rc = io.NopCloser(rd)
		}
		req.Body, req.ContentLength = rc, -1
		if br, ok := rd.(*bytes.Reader); ok {
			req.ContentLength = int64(br.Len())
		}
		req.Header.Set("Content-Type", ctype)
	}
	req.Header.Set("Accept", "application/json")
	if c.key != "" {
		req.Header.Set("Authorization", "Bearer "+c.key)
	}
	resp, err = c.hc.Do(req)
	if err != nil {
		if ctx.Err() != nil {
			return nil, false, ctx.Err()
		}
		return nil, true, err
	}
	if resp.StatusCode/100 == 2 {
		return resp, false, nil
	}
	raw, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	resp.Body.Close()
	var e struct {
		Error struct {
			Message string `json:"message"`
		} `json:"error"`
	}
	_ = json.Unmarshal(raw, &e)
	return nil, retryable(resp.StatusCode), &apiError{StatusCode: resp.StatusCode, Message: e.Error.Message}
}

// callJSON makes a call whose body is in (nil: none) as JSON and whose
// answer is decoded into out; it returns the answer's bytes.
func (c *batchClient) callJSON(ctx context.Context, method, path string, in, out any) ([]byte, error) {
	var body func() (io.Reader, string, error)
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return nil, err
		}
		body = func() (io.Reader, string, error) { return bytes.NewReader(b), "application/json", nil }
	}
	resp, err := c.call(ctx, method, path, body)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	raw, err := io.ReadAll(resp.Body)
	if err != nil {
		return nil, err
	}
	if err := json.Unmarshal(raw, out); err != nil {
		return nil, fmt.Errorf("%s %s: the answer is not the JSON expected: %w", method, path, err)
	}
	return raw, nil
}

// uploadFile uploads path with purpose=batch and returns the file's id.
// The file is streamed as a multipart form, opened again for a retry.
func (c *batchClient) uploadFile(ctx context.Context, path string) (string, error) {
	f, err := os.Open(path)
	if err != nil {
		return "", err
	}
	f.Close() // opened to fail early and plainly on a missing file
	body := func() (io.Reader, string, error) {
		f, err := os.Open(path)
		if err != nil {
			return nil, "", err
		}
		pr, pw := io.Pipe()
		mw := multipart.NewWriter(pw)
		go func() {
			defer f.Close()
			err := mw.WriteField("purpose", "batch")
			if err == nil {
				h := make(textproto.MIMEHeader)
				h.Set("Content-Disposition", fmt.Sprintf(`form-data; name="file"; filename=%q`, filepath.Base(path)))
				h.Set("Content-Type", "application/jsonl")
				var w io.Writer
				if w, err = mw.CreatePart(h); err == nil {
					_, err = io.Copy(w, f)
				}
			}
			if err == nil {
				err = mw.Close()
			}
			pw.CloseWithError(err)
		}()
		return pr, mw.FormDataContentType(), nil
	}
	resp, err := c.call(ctx, http.MethodPost, "files", body)
	if err != nil {
		return "", err
	}
	defer resp.Body.Close()
	var up struct {
		ID string `json:"id"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&up); err != nil || up.ID == "" {
		return "", fmt.Errorf("the answer holds no file id (%v)", err)
	}
	return up.ID, nil
}

// batchCall makes a call answered with a Batch object.
func (c *batchClient) batchCall(ctx context.Context, method, path string, in any) (*batchObject, error) {
	var b batchObject
	raw, err := c.callJSON(ctx, method, path, in, &b)
	if err != nil {
		return nil, err
	}
	b.raw = raw
	return &b, nil
}

// createBatch creates a batch of the uploaded file fileID.
func (c *batchClient) createBatch(ctx context.Context, fileID, endpoint, window string, meta map[string]string) (*batchObject, error) {
	in := map[string]any{"input_file_id": fileID, "endpoint": endpoint, "completion_window": window}
	if meta != nil {
		in["metadata"] = meta
	}
	return c.batchCall(ctx, http.MethodPost, "batches", in)
}

// getBatch fetches batch id.
func (c *batchClient) getBatch(ctx context.Context, id string) (*batchObject, error) {
	return c.batchCall(ctx, http.MethodGet, "batches/"+url.PathEscape(id), nil)
}

// cancelBatch asks for batch id to be cancelled.
func (c *batchClient) cancelBatch(ctx context.Context, id string) (*batchObject, error) {
	return c.batchCall(ctx, http.MethodPost, "batches/"+url.PathEscape(id)+"/cancel", nil)
}

// listBatches returns the newest limit batches.
func (c *batchClient) listBatches(ctx context.Context, limit int64) ([]batchObject, error) {
	var page struct {
		Data []batchObject `json:"data"`
	}
	_, err := c.callJSON(ctx, http.MethodGet, "batches?limit="+strconv.FormatInt(limit, 10), nil, &page)
	return page.Data, err
}

// fileContent opens the content of file id; the caller closes it.
func (c *batchClient) fileContent(ctx context.Context, id string) (io.ReadCloser, error) {
	resp, err := c.call(ctx, http.MethodGet, "files/"+url.PathEscape(id)+"/content", nil)
	if err != nil {
		return nil, err
	}
	return resp.Body, nil
}

// explain turns a client error into one line: the API's own message, or,
// when nothing answered as a Batch API, where the user should look.
func (c *batchClient) explain(what string, err error) error {
	var apiErr *apiError
	if errors.As(err, &apiErr) {
		if apiErr.StatusCode == http.StatusNotFound && apiErr.Message == "" {
			return fmt.Errorf("no Batch API at %s (%s answered 404): is `sluice serve` running with batch_api enabled?", c.api, what)
		}
		msg := apiErr.Message
		if msg == "" {
			msg = http.StatusText(apiErr.StatusCode)
		}
		return fmt.Errorf("%s: %d %s", what, apiErr.StatusCode, msg)
	}
	if errors.Is(err, context.Canceled) || errors.Is(err, context.DeadlineExceeded) {
		return fmt.Errorf("%s: %w", what, err)
	}
	return fmt.Errorf("no Batch API at %s: is `sluice serve` running with batch_api enabled? (%s: %v)", c.api, what, err)
}
