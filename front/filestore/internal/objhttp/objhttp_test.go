package objhttp

import (
	"context"
	"errors"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
)

func TestDo(t *testing.T) {
	var calls atomic.Int64
	status := atomic.Int64{}
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		calls.Add(1)
		w.WriteHeader(int(status.Load()))
		w.Write([]byte("said"))
	}))
	defer srv.Close()
	newReq := func() (*http.Request, error) { return http.NewRequest(http.MethodGet, srv.URL, nil) }
	decode := func(code int, body []byte) string { return string(body) }
	ctx := context.Background()

	for _, tc := range []struct {
		status int
		calls  int64
		ok     bool
	}{
		{http.StatusOK, 1, true},
		{http.StatusServiceUnavailable, MaxTries, false},
		{http.StatusTooManyRequests, MaxTries, false},
		{http.StatusBadRequest, 1, false},
		{http.StatusNotFound, 1, false},
	} {
		calls.Store(0)
		status.Store(int64(tc.status))
		resp, err := Do(ctx, srv.Client(), newReq, decode, http.StatusOK)
		if (err == nil) != tc.ok || calls.Load() != tc.calls {
			t.Errorf("status %d: err %v after %d calls; want ok %v after %d", tc.status, err, calls.Load(), tc.ok, tc.calls)
		}
		if err == nil {
			resp.Body.Close()
			continue
		}
		var se *StatusError
		if !errors.As(err, &se) || se.Code != tc.status || se.Message != "said" || !IsStatus(err, tc.status) {
			t.Errorf("status %d: error %#v", tc.status, err)
		}
	}

	// A request that cannot be built is not sent again.
	calls.Store(0)
	boom := errors.New("no credentials")
	if _, err := Do(ctx, srv.Client(), func() (*http.Request, error) { return nil, boom }, decode, http.StatusOK); !errors.Is(err, boom) {
		t.Errorf("newReq failing: %v", err)
	}
	// A cancelled context ends the retries.
	status.Store(http.StatusServiceUnavailable)
	cctx, cancel := context.WithCancel(ctx)
	cancel()
	calls.Store(0)
	if _, err := Do(cctx, srv.Client(), newReq, decode, http.StatusOK); err == nil || calls.Load() > 1 {
		t.Errorf("cancelled: %v after %d calls", err, calls.Load())
	}
}
