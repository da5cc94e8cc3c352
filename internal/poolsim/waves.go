package poolsim

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Waves is interactive traffic in phases: an idle warm-up, then Cycles of
// a burst phase and an idle phase, with Poisson arrivals at each phase's
// rate. The benchmark and the demo drive the pool's front with it; the
// same seed gives the same arrival times, so two runs see the same load.
type Waves struct {
	// Warmup is the idle phase before the first burst.
	Warmup time.Duration
	// Burst and Idle are the lengths of the two phases of a cycle.
	Burst, Idle time.Duration
	// Cycles is how many burst+idle cycles follow the warm-up.
	Cycles int
	// BurstRate and IdleRate are the arrivals per second in each phase.
	BurstRate, IdleRate float64
	// Seed draws the arrivals.
	Seed uint64
}

// Validate reports unusable waves.
func (w Waves) Validate() error {
	var errs []error
	if w.Warmup < 0 || w.Burst <= 0 || w.Idle < 0 {
		errs = append(errs, fmt.Errorf("waves: warm-up %s, burst %s and idle %s must be ≥ 0 (burst > 0)", w.Warmup, w.Burst, w.Idle))
	}
	if w.Cycles < 1 {
		errs = append(errs, fmt.Errorf("waves: cycles %d must be ≥ 1", w.Cycles))
	}
	if !(w.BurstRate > 0) || !(w.IdleRate > 0) {
		errs = append(errs, fmt.Errorf("waves: rates %v (burst) and %v (idle) must be > 0", w.BurstRate, w.IdleRate))
	}
	return errors.Join(errs...)
}

// Length is the whole schedule: the warm-up and every cycle.
func (w Waves) Length() time.Duration { return w.Warmup + time.Duration(w.Cycles)*(w.Burst+w.Idle) }

// Schedule returns the arrival times (from the start, ascending) and the
// burst phases as [from, to) offsets.
func (w Waves) Schedule() (arrivals []time.Duration, bursts [][2]time.Duration) {
	rng := rand.New(rand.NewPCG(w.Seed, 1))
	type phase struct {
		from, to time.Duration
		rate     float64
	}
	phases := []phase{{0, w.Warmup, w.IdleRate}}
	for c := range w.Cycles {
		b := w.Warmup + time.Duration(c)*(w.Burst+w.Idle)
		phases = append(phases, phase{b, b + w.Burst, w.BurstRate}, phase{b + w.Burst, b + w.Burst + w.Idle, w.IdleRate})
		bursts = append(bursts, [2]time.Duration{b, b + w.Burst})
	}
	for _, p := range phases {
		// The draw restarts at each phase: Poisson arrivals are memoryless.
		for t := p.from; ; {
			t += time.Duration(rng.ExpFloat64() / p.rate * float64(time.Second))
			if t >= p.to {
				break
			}
			arrivals = append(arrivals, t)
		}
	}
	return arrivals, bursts
}

// InBurst reports whether offset t falls in one of bursts.
func InBurst(bursts [][2]time.Duration, t time.Duration) bool {
	for _, b := range bursts {
		if t >= b[0] && t < b[1] {
			return true
		}
	}
	return false
}

// TextPrompt is a JSON string prompt the pool counts as n tokens (4 bytes
// each, as estimateTokens reads text): a prompt a client can continue by
// appending text, as core/resume does.
func TextPrompt(n int) string {
	b := make([]byte, 0, 4*n+2)
	b = append(b, '"')
	for i := range n {
		b = append(b, " w"...)
		b = append(b, byte('a'+i%26), byte('a'+(i/26)%26))
	}
	return string(append(b, '"'))
}

// TextPromptFor is TextPrompt made distinct by id: its first three tokens
// spell id (base 26, up to 26⁶ ids), so that two requests' prompts share
// less than a KV block and a prefix cache (EngineConfig.PrefixCaching)
// finds nothing between them, as between a real batch's requests.
func TextPromptFor(n int, id uint64) string {
	b := []byte(TextPrompt(n))
	for k := range min(3, n) {
		at := 1 + 4*k // after the quote: " x" and two letters per token
		b[at+1] = 'x'
		b[at+2], b[at+3] = byte('a'+id%26), byte('a'+(id/26)%26)
		id /= 26 * 26
	}
	return string(b)
}

// TokenPrompt is a JSON prompt of n token ids: the simulator counts a
// token array exactly (a text prompt is estimated at four bytes a token).
func TokenPrompt(n int) string {
	var b strings.Builder
	b.WriteByte('[')
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(strconv.Itoa(100 + i%900))
	}
	b.WriteByte(']')
	return b.String()
}

// Client sends interactive requests to a front: streamed completions of
// PromptTokens prompt tokens and MaxTokens output tokens, with the
// objective header Objective.
type Client struct {
	// Front is the front's base URL (http://host:port).
	Front string
	// PromptTokens and MaxTokens size each request.
	PromptTokens, MaxTokens int
	// Objective is sent as x-gateway-inference-objective (default
	// "interactive-default").
	Objective string

	http *http.Client
	body []byte
}

// Drive sends one request at each arrival offset from start, each on its
// own goroutine (a few dozen at once for the default pool), and returns
// how many did not stream to the end. It returns when every request has
// ended, or early, counting the rest as failed, when ctx ends.
func (c *Client) Drive(ctx context.Context, start time.Time, arrivals []time.Duration) int {
	if c.http == nil {
		c.http = &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}
		obj := c.Objective
		if obj == "" {
			obj = "interactive-default"
		}
		c.Objective = obj
		c.body = fmt.Appendf(nil, `{"model":%q,"prompt":%s,"max_tokens":%d,"stream":true}`, DefaultModelName, TokenPrompt(c.PromptTokens), c.MaxTokens)
	}
	defer c.http.CloseIdleConnections()
	var failed atomic.Int64
	var wg sync.WaitGroup
	defer wg.Wait()
	for i, a := range arrivals {
		if d := time.Until(start.Add(a)); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-ctx.Done():
				t.Stop()
				failed.Add(int64(len(arrivals) - i))
				wg.Wait()
				return int(failed.Load())
			case <-t.C:
			}
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := c.stream(ctx); err != nil {
				failed.Add(1)
			}
		}()
	}
	wg.Wait()
	return int(failed.Load())
}

// stream sends one request and reads its event stream to [DONE].
func (c *Client) stream(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.Front+"/v1/completions", bytes.NewReader(c.body))
	if err != nil {
		return err
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Gateway-Inference-Objective", c.Objective)
	resp, err := c.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("status %d", resp.StatusCode)
	}
	sc := bufio.NewScanner(resp.Body)
	for sc.Scan() {
		if bytes.Equal(sc.Bytes(), []byte("data: [DONE]")) {
			return nil
		}
	}
	if err := sc.Err(); err != nil {
		return err
	}
	return errors.New("stream ended without [DONE]")
}
