package main

import (
	"bufio"
	"context"
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
}

// publish is one Publish call a subscriber made (a result, a dead letter):
// when it was sent, to which topic, and whether the emulator accepted it.
type publish struct {
	at    time.Time
	topic string
	ok    bool
}

// delivery is one delivery of a request message on a streaming pull.
type delivery struct {
	stream int
	at     time.Time
}

const (
	streamingPull = "/google.pubsub.v1.Subscriber/StreamingPull"
	publishMethod = "/google.pubsub.v1.Publisher/Publish"
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
		deliveries: map[string][]delivery{}, streamPID: map[int]int{}, published: map[string][]publish{}}
	p.srv = grpc.NewServer(grpc.UnknownServiceHandler(p.handle), grpc.ForceServerCodec(rawCodec{}),
		grpc.MaxRecvMsgSize(proxyMaxMsg), grpc.MaxSendMsgSize(proxyMaxMsg))
	go func() { _ = p.srv.Serve(ln) }()
	return p, nil
}

func (p *pubSubProxy) close() {
	p.srv.Stop()
	p.up.Close()
}

// handle forwards one call of any method, frame by frame.
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
	stream := -1
	if method == streamingPull {
		stream = p.openStream(ss.Context())
	}
	var pub *pubsubpb.PublishRequest // the request of a Publish call
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
			if method == publishMethod && pub == nil {
				pub = &pubsubpb.PublishRequest{}
				if proto.Unmarshal(f.b, pub) != nil {
					pub = nil
				}
			}
			if err := cs.SendMsg(f); err != nil {
				return
			}
		}
	}()
	at := time.Now()
	if method == publishMethod {
		ok := false
		defer func() {
			<-sent
			p.recordPublish(pub, at, ok)
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
		if err := ss.SendMsg(f); err != nil {
			return err
		}
		ok = true
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

// openStream numbers a new streaming pull and finds its process.
func (p *pubSubProxy) openStream(ctx context.Context) int {
	pid := 0
	if pr, ok := peer.FromContext(ctx); ok && p.owner != nil {
		if a, ok := pr.Addr.(*net.TCPAddr); ok {
			pid = p.owner(a.Port)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	p.seq++
	p.streamPID[p.seq] = pid
	return p.seq
}

// record notes the request ids of one StreamingPull response.
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
		if id, _ := resultID(m.Message.Data); id != "" {
			p.deliveries[id] = append(p.deliveries[id], delivery{stream: stream, at: now})
		}
	}
}

// recordPublish notes the ids of a Publish call's messages.
func (p *pubSubProxy) recordPublish(r *pubsubpb.PublishRequest, at time.Time, ok bool) {
	if r == nil {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	for _, m := range r.Messages {
		if id, _ := resultID(m.Data); id != "" {
			p.published[id] = append(p.published[id], publish{at: at, topic: r.Topic, ok: ok})
		}
	}
}

// publishedTo returns the accepted Publish calls to topic carrying id.
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

// lastHolder returns the process the emulator last delivered id to
// (0: unknown), and whether it delivered it at all.
func (p *pubSubProxy) lastHolder(id string) (pid int, delivered bool) {
	p.mu.Lock()
	defer p.mu.Unlock()
	ds := p.deliveries[id]
	if len(ds) == 0 {
		return 0, false
	}
	return p.streamPID[ds[len(ds)-1].stream], true
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
