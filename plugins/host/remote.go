package host

import (
	"context"
	"errors"
	"fmt"
	"math"
	"sync/atomic"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"

	"github.com/sluice-io/sluice/core/gate"
	"github.com/sluice-io/sluice/core/wire"
	"github.com/sluice-io/sluice/plugins/sdk"
	"github.com/sluice-io/sluice/plugins/sdk/gatepb"
)

// errUnavailable is matched by a call's error when the plugin could not be
// reached (gRPC's codes.Unavailable): the supervisor restarts it.
var errUnavailable = errors.New("plugin unavailable")

// ErrRefused is matched by configure's error when the plugin refused its
// parameters: permanent, since a restart cannot fix them.
var ErrRefused = errors.New("plugin refused its parameters")

// The RPCs, as indexes into callStats and names in metrics.
const (
	rpcConfigure = iota
	rpcBudget
	rpcAdmit
	rpcDescribe
	numRPC
)

var rpcNames = [numRPC]string{"configure", "budget", "admit", "describe"}

// callBuckets are the upper bounds, in seconds, of the call histogram: a
// local gRPC round trip takes tens to hundreds of microseconds.
var callBuckets = [...]float64{0.00005, 0.0001, 0.00025, 0.0005, 0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 10}

// callStats times one RPC, lock-free.
type callStats struct {
	count, failures atomic.Uint64
	nanos           atomic.Int64
	buckets         [len(callBuckets)]atomic.Uint64 // non-cumulative
}

func (c *callStats) observe(d time.Duration, failed bool) {
	c.count.Add(1)
	c.nanos.Add(int64(d))
	if failed {
		c.failures.Add(1)
	}
	s := d.Seconds()
	for i, ub := range callBuckets {
		if s <= ub {
			c.buckets[i].Add(1)
			return
		}
	}
}

func (c *callStats) snapshot(name string) gate.CallStats {
	out := gate.CallStats{Call: name, Buckets: make(map[float64]uint64, len(callBuckets))}
	var cum uint64
	for i, ub := range callBuckets {
		cum += c.buckets[i].Load()
		out.Buckets[ub] = cum
	}
	// Read the count last, so that it is never below the buckets' sum.
	out.Count = max(c.count.Load(), cum)
	out.Failures = c.failures.Load()
	out.Seconds = float64(c.nanos.Load()) / 1e9
	return out
}

// remote speaks the plugin protocol of the negotiated version over one
// plugin connection, mapping sluice's types to protobuf and back, and
// times every call. Every method is one round trip carrying ctx.
type remote struct {
	rpc     gatepb.GateClient
	version int
	stats   *[numRPC]callStats
}

// describeInfo is what Describe tells.
type describeInfo struct {
	description, sdk string
	admitter         bool // v2 only
}

// configure sends params; a refusal is an error matching ErrRefused. It
// also reports whether the connection runs over TLS.
func (r *remote) configure(ctx context.Context, params map[string]string) (admitter, tls bool, err error) {
	var p peer.Peer
	start := time.Now()
	resp, err := r.rpc.Configure(ctx, &gatepb.ConfigureRequest{Params: params}, grpc.Peer(&p))
	r.stats[rpcConfigure].observe(time.Since(start), err != nil)
	if err != nil {
		return false, false, callError("configure", err)
	}
	tls = p.AuthInfo != nil && p.AuthInfo.AuthType() == "tls"
	if msg := resp.GetError(); msg != "" {
		return false, tls, &markedError{err: errors.New(msg), mark: ErrRefused}
	}
	return resp.GetAdmitter(), tls, nil
}

// budget asks for the budget and checks that it is in [0,1].
func (r *remote) budget(ctx context.Context) (float64, error) {
	start := time.Now()
	resp, err := r.rpc.Budget(ctx, &gatepb.BudgetRequest{})
	b := resp.GetBudget()
	switch {
	case err != nil:
	case math.IsNaN(b) || b < 0 || b > 1:
		err = fmt.Errorf("budget %v outside [0,1]", b)
	}
	r.stats[rpcBudget].observe(time.Since(start), err != nil || resp.GetFallback() != "")
	if err != nil {
		return 0, callError("budget", err)
	}
	if fb := resp.GetFallback(); fb != "" {
		return 0, &gate.FallbackError{Budget: b, Err: errors.New(fb)}
	}
	return b, nil
}

// admit sends req without its payload, decodes the decision and applies
// the labels the plugin set (v2).
func (r *remote) admit(ctx context.Context, req *wire.Request) (gate.Decision, error) {
	start := time.Now()
	resp, err := r.rpc.Admit(ctx, requestToProto(req, r.version))
	var d gate.Decision
	if err == nil {
		d, err = decisionFromProto(resp, r.version)
	}
	r.stats[rpcAdmit].observe(time.Since(start), err != nil)
	if err != nil {
		return gate.Decision{}, callError("admit", err)
	}
	if r.version >= sdk.ProtocolV2 {
		for k, v := range resp.GetLabels() {
			req.SetLabel(k, v)
		}
	}
	return d, nil
}

// describe asks for the plugin's description; a plugin without Describe
// (codes.Unimplemented, possible in another language) has none.
func (r *remote) describe(ctx context.Context) (describeInfo, error) {
	start := time.Now()
	resp, err := r.rpc.Describe(ctx, &gatepb.DescribeRequest{})
	if status.Code(err) == codes.Unimplemented {
		err, resp = nil, &gatepb.DescribeResponse{}
	}
	r.stats[rpcDescribe].observe(time.Since(start), err != nil)
	if err != nil {
		return describeInfo{}, callError("describe", err)
	}
	return describeInfo{description: resp.GetDescription(), sdk: resp.GetSdk(), admitter: resp.GetAdmitter()}, nil
}

// callError names the call that failed and marks an unreachable plugin with
// errUnavailable. The gRPC status stays reachable (status.Code works on it).
func callError(call string, err error) error {
	wrapped := fmt.Errorf("%s: %w", call, err)
	if status.Code(err) == codes.Unavailable {
		return &markedError{err: wrapped, mark: errUnavailable}
	}
	return wrapped
}

// markedError is err, also matching mark, with err's message only.
type markedError struct {
	err  error
	mark error
}

func (e *markedError) Error() string   { return e.err.Error() }
func (e *markedError) Unwrap() []error { return []error{e.err, e.mark} }

// requestToProto describes req for Admit; the payload is not sent, the
// labels only from v2.
func requestToProto(req *wire.Request, version int) *gatepb.AdmitRequest {
	out := &gatepb.AdmitRequest{
		Id:         req.ID,
		Metadata:   req.Metadata,
		Headers:    req.Headers,
		Endpoint:   req.Endpoint,
		RetryCount: int32(min(req.RetryCount, math.MaxInt32)),
	}
	if version >= sdk.ProtocolV2 {
		out.Labels = req.Labels
	}
	if !req.Deadline.IsZero() {
		out.DeadlineUnixMs = req.Deadline.UnixMilli()
	}
	if !req.Created.IsZero() {
		out.CreatedUnixMs = req.Created.UnixMilli()
	}
	return out
}

// decisionFromProto decodes a decision of protocol version; a verdict the
// version does not define is an error (the request is then deferred by
// the pipeline's error delay), and a negative delay counts as none.
func decisionFromProto(in *gatepb.AdmitResponse, version int) (gate.Decision, error) {
	d := gate.Decision{Reason: in.GetReason()}
	delay := time.Duration(max(in.GetDelayMs(), 0)) * time.Millisecond
	switch v := in.GetVerdict(); {
	case v == gatepb.Verdict_VERDICT_ADMIT:
		d.Verdict = gate.Admit
	case v == gatepb.Verdict_VERDICT_DEFER:
		d.Verdict, d.Delay = gate.Defer, delay
	case v == gatepb.Verdict_VERDICT_REJECT:
		d.Verdict = gate.Reject
	case v == gatepb.Verdict_VERDICT_WAIT && version >= sdk.ProtocolV2:
		d.Verdict, d.Delay = gate.Wait, delay
	default:
		return gate.Decision{}, fmt.Errorf("unknown verdict %d for protocol version %d", int32(v), version)
	}
	return d, nil
}
