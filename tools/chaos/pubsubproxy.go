package main

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"cloud.google.com/go/pubsub/v2/apiv1/pubsubpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/protobuf/proto"
)

// pubSubProxy is a gRPC proxy between the subscribers under test (sluice's
// replicas, the bare control) and the Pub/Sub emulator. It passes every
// call through unchanged and records, from the StreamingPull responses,
// which request id the emulator delivered on which stream, when, and which
// process owned that stream. That is how the kill -9 case tells a request
// the emulator has not delivered again since a killed subscriber held it
// (the broker's doing) from one a live replica received and did not answer
// (a loss of sluice's).
//
// Like the front end of the real service, it ends the emulator-side stream
// of a subscriber that died with a cancel on a live connection.
type pubSubProxy struct {
	Addr string
	srv  *grpc.Server
	up   *grpc.ClientConn
	// owner maps a stream's client port to its process (nil: unknown).
	owner func(port int) int

	mu         sync.Mutex
	seq        int
	deliveries map[string][]delivery // request id → deliveries, in order
	streamPID  map[int]int           // stream → the process that opened it (0: unknown)
	published  map[string][]publish  // id in a published message → Publish calls that carried it
	ackIDs     map[string]string     // ack id of a delivery → its request id
	acks       map[string][]ackCall  // request id → acks and deadline changes of its deliveries
	unmapped   int                   // ack ids acked or modified that no delivery carried
}

// publish is one Publish call a subscriber made (a result, a dead letter,
// a retry's re-queue): when it was sent and answered, to which topic, and
// whether the emulator accepted it.
type publish struct {
	at, done time.Time
	topic    string
	ok       bool
}

// delivery is one delivery of a request message on a streaming pull.
type delivery struct {
	stream int
	at     time.Time
	ackID  string
}

// ackCall is one ack of a delivery (deadline < 0), or a change of its ack
// deadline (0: a nack, handing it back; > 0: an extension), as a
// subscriber sent it: when, from which process (0: unknown), and whether
// the emulator answered it with success (false also when the call never
// got an answer: it may still have been applied).
type ackCall struct {
	at       time.Time
	pid      int
	deadline int
	ok       bool
}

const (
	streamingPull = "/google.pubsub.v1.Subscriber/StreamingPull"
	publishMethod = "/google.pubsub.v1.Publisher/Publish"
	ackMethod     = "/google.pubsub.v1.Subscriber/Acknowledge"
	modAckMethod  = "/google.pubsub.v1.Subscriber/ModifyAckDeadline"
)

// proxyMaxMsg bounds one frame either way (the fuzz case's chunks of
// 100 messages of up to 1 MiB).
const proxyMaxMsg = 256 << 20

func startPubSubProxy(upstream string, owner func(port int) int) (*pubSubProxy, error) {
	up, err := grpc.NewClient(upstream, grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(proxyMaxMsg), grpc.MaxCallSendMsgSize(proxyMaxMsg)))
	if err != nil {
		return nil, err
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		up.Close()
		return nil, err
	}
	p := &pubSubProxy{Addr: ln.Addr().String(), up: up, owner: owner,
		deliveries: map[string][]delivery{}, streamPID: map[int]int{}, published: map[string][]publish{},
		ackIDs: map[string]string{}, acks: map[string][]ackCall{}}
	p.srv = grpc.NewServer(grpc.UnknownServiceHandler(p.handle), grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(proxyMaxMsg), grpc.MaxSendMsgSize(proxyMaxMsg))
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *pubSubProxy) close() {
	p.srv.Stop()
	p.up.Close()
}

// handle forwards one call of any method, frame by frame, and records
// what the kill -9 accounting needs: the deliveries of a StreamingPull (and
// the acks and deadline changes a client sends on it), and the request and
// outcome of each Publish, Acknowledge and ModifyAckDeadline call.
func (p *pubSubProxy) handle(_ any, ss grpc.ServerStream) error {
	method, ok := grpc.MethodFromServerStream(ss)
	if !ok {
		return errors.New("no method")
	}
	md, _ := metadata.FromIncomingContext(ss.Context())
	ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(ss.Context(), md.Copy()))
	defer cancel()
	cs, err := p.up.NewStream(ctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true}, method, grpc.ForceCodec(rawCodec{}))
	if err != nil {
		return err
	}
	pid := p.peerPID(ss.Context())
	stream := -1
	if method == streamingPull {
		stream = p.openStream(pid)
	}
	unary := method == publishMethod || method == ackMethod || method == modAckMethod
	var req []byte // the request of a unary call, once sent upstream
	var reqAt time.Time
	sent := make(chan struct{})
	go func() {
		defer close(sent)
		for {
			f := &rawFrame{}
			if err := ss.RecvMsg(f); err != nil {
				if errors.Is(err, io.EOF) {
					_ = cs.CloseSend()
				} else {
					cancel()
				}
				return
			}
			at := time.Now()
			if method == streamingPull {
				p.recordPullRequest(f.b, at, pid)
			}
			if err := cs.SendMsg(f); err != nil {
				return
			}
			if unary && req == nil {
				req, reqAt = f.b, at
			}
		}
	}()
	if unary {
		ok, doneAt := false, time.Time{}
		defer func() {
			<-sent
			if doneAt.IsZero() {
				doneAt = time.Now()
			}
			if req != nil {
				p.recordUnary(method, req, reqAt, doneAt, pid, ok)
			}
		}()
		f := &rawFrame{}
		if h, err := cs.Header(); err == nil {
			_ = ss.SendHeader(h)
		}
		if err := cs.RecvMsg(f); err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		// The emulator answered with success: noted before the client can
		// see the answer (and ack what the call published).
		ok, doneAt = true, time.Now()
		if err := ss.SendMsg(f); err != nil {
			return err
		}
		if err := cs.RecvMsg(&rawFrame{}); !errors.Is(err, io.EOF) && err != nil {
			ok = false
			return err
		}
		ss.SetTrailer(cs.Trailer())
		return nil
	}
	if h, err := cs.Header(); err == nil {
		_ = ss.SendHeader(h)
	}
	for {
		f := &rawFrame{}
		if err := cs.RecvMsg(f); err != nil {
			ss.SetTrailer(cs.Trailer())
			if errors.Is(err, io.EOF) {
				return nil
			}
			return err
		}
		if stream >= 0 {
			p.record(stream, f.b)
		}
		if err := ss.SendMsg(f); err != nil {
			return err
		}
	}
}

// peerPID finds the process at the other end of a call (0: unknown).
func (p *pubSubProxy) peerPID(ctx context.Context) int {
	if pr, ok := peer.FromContext(ctx); ok && p.owner != nil {
		if a, ok := pr.Addr.(*net.TCPAddr); ok {
			return p.owner(a.Port)
		}
	}
	return 0
}

// openStream numbers a new streaming pull of process pid.
func (p *pubSubProxy) openStream(pid int) int {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	p.streamPID[p.seq] = pid
	return p.seq
}

// record notes the request ids and ack ids of one StreamingPull response.
func (p *pubSubProxy) record(stream int, b []byte) {
	var r pubsubpb.StreamingPullResponse
	if proto.Unmarshal(b, &r) != nil {
		return
	}
	now := time.Now()
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range r.ReceivedMessages {
		if m.GetMessage() == nil {
			continue
		}
		if id := requestID(m.Message.Data); id != "" {
			p.deliveries[id] = append(p.deliveries[id], delivery{stream: stream, at: now, ackID: m.AckId})
			p.ackIDs[m.AckId] = id
		}
	}
}

// recordPullRequest notes the acks and deadline changes a client sends on
// its streaming pull (the Go client sends them as separate calls; others
// may not).
func (p *pubSubProxy) recordPullRequest(b []byte, at time.Time, pid int) {
	var r pubsubpb.StreamingPullRequest
	if proto.Unmarshal(b, &r) != nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, a := range r.AckIds {
		p.noteAck(a, ackCall{at: at, pid: pid, deadline: -1})
	}
	for i, a := range r.ModifyDeadlineAckIds {
		if i < len(r.ModifyDeadlineSeconds) {
			p.noteAck(a, ackCall{at: at, pid: pid, deadline: int(r.ModifyDeadlineSeconds[i])})
		}
	}
}

// recordUnary notes one Publish, Acknowledge or ModifyAckDeadline call: its
// request, sent at at, answered (ok) or not at done.
func (p *pubSubProxy) recordUnary(method string, b []byte, at, done time.Time, pid int, ok bool) {
	switch method {
	case publishMethod:
		var r pubsubpb.PublishRequest
		if proto.Unmarshal(b, &r) == nil {
			p.recordPublish(&r, at, done, ok)
		}
	case ackMethod:
		var r pubsubpb.AcknowledgeRequest
		if proto.Unmarshal(b, &r) == nil {
			p.mu.Lock()
			for _, a := range r.AckIds {
				p.noteAck(a, ackCall{at: at, pid: pid, deadline: -1, ok: ok})
			}
			p.mu.Unlock()
		}
	case modAckMethod:
		var r pubsubpb.ModifyAckDeadlineRequest
		if proto.Unmarshal(b, &r) == nil {
			p.mu.Lock()
			for _, a := range r.AckIds {
				p.noteAck(a, ackCall{at: at, pid: pid, deadline: int(r.AckDeadlineSeconds), ok: ok})
			}
			p.mu.Unlock()
		}
	}
}

// noteAck maps an ack id back to its request (p.mu held).
func (p *pubSubProxy) noteAck(ackID string, c ackCall) {
	id, ok := p.ackIDs[ackID]
	if !ok {
		p.unmapped++
		return
	}
	p.acks[id] = append(p.acks[id], c)
}

// recordPublish notes the ids of a Publish call's messages.
func (p *pubSubProxy) recordPublish(r *pubsubpb.PublishRequest, at, done time.Time, ok bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range r.Messages {
		if id := requestID(m.Data); id != "" {
			p.published[id] = append(p.published[id], publish{at: at, done: done, topic: r.Topic, ok: ok})
		}
	}
}

// requestID reads the id of a request or result message: a top-level id
// (the flat form, a result) or the envelope's data.id ("" when neither).
func requestID(b []byte) string {
	var m struct {
		ID   string `json:"id"`
		Data *struct {
			ID string `json:"id"`
		} `json:"data"`
	}
	if json.Unmarshal(b, &m) != nil {
		return ""
	}
	if m.ID == "" && m.Data != nil {
		return m.Data.ID
	}
	return m.ID
}

// publishedTo returns when the accepted Publish calls to topic carrying id
// were sent.
func (p *pubSubProxy) publishedTo(id, topic string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var out []time.Time
	for _, x := range p.published[id] {
		if x.ok && x.topic == topic {
			out = append(out, x.at)
		}
	}
	return out
}

// history is a copy of what the proxy recorded, for the accounting
// (accountPubSub): per request id, its deliveries with the process each
// went to, the acks and deadline changes of its deliveries, and the
// Publish calls carrying it.
func (p *pubSubProxy) history() psHistory {
	p.mu.Lock()
	defer p.mu.Unlock()
	h := psHistory{deliveries: map[string][]psDelivery{}, acks: map[string][]ackCall{}, published: map[string][]publish{},
		unmappedAcks: p.unmapped}
	for id, ds := range p.deliveries {
		for _, d := range ds {
			h.deliveries[id] = append(h.deliveries[id], psDelivery{at: d.at, pid: p.streamPID[d.stream]})
		}
	}
	for id, as := range p.acks {
		h.acks[id] = append([]ackCall(nil), as...)
	}
	for id, ps := range p.published {
		h.published[id] = append([]publish(nil), ps...)
	}
	return h
}

// rawFrame is one gRPC message, passed through as bytes.
type rawFrame struct{ b []byte }

// rawCodec passes frames through without decoding them.
type rawCodec struct{}

func (rawCodec) Marshal(v any) ([]byte, error) { return v.(*rawFrame).b, nil }

func (rawCodec) Unmarshal(data []byte, v any) error {
	v.(*rawFrame).b = append([]byte(nil), data...)
	return nil
}

func (rawCodec) Name() string { return "proto" }

// socketOwner returns which of pids owns the loopback TCP socket whose
// local port is port (0 when none does), from /proc: the socket's inode in
// /proc/net/tcp{,6}, then the process with a descriptor on it.
func socketOwner(port int, pids []int) int {
	inode := ""
	for _, f := range []string{"/proc/net/tcp", "/proc/net/tcp6"} {
		if inode = socketInode(f, port); inode != "" {
			break
		}
	}
	if inode == "" {
		return 0
	}
	want := "socket:[" + inode + "]"
	for _, pid := range pids {
		fds, err := os.ReadDir(fmt.Sprintf("/proc/%d/fd", pid))
		if err != nil {
			continue
		}
		for _, fd := range fds {
			if l, err := os.Readlink(fmt.Sprintf("/proc/%d/fd/%s", pid, fd.Name())); err == nil && l == want {
				return pid
			}
		}
	}
	return 0
}

// socketInode finds the inode of the socket with local port port in a
// /proc/net/tcp-format file.
func socketInode(path string, port int) string {
	f, err := os.Open(path)
	if err != nil {
		return ""
	}
	defer f.Close()
	hexPort := fmt.Sprintf(":%04X", port)
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		fs := strings.Fields(sc.Text())
		if len(fs) < 10 || !strings.HasSuffix(fs[1], hexPort) {
			continue
		}
		if _, err := strconv.Atoi(fs[9]); err == nil && fs[9] != "0" {
			return fs[9]
		}
	}
	return ""
}
