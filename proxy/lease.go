package proxy

import (
	"context"
	"errors"
	"io"
	"strings"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Lease keep-alive multiplexing: every client LeaseKeepAlive stream with
// the same credentials shares one upstream LeaseKeepAlive stream. Each
// client request is forwarded at once (concurrent requests for the same
// lease share one upstream request) and the response goes back to every
// client that asked.

const kaQueue = 256

type leaseMux struct {
	p      *Proxy
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	ups map[string]*kaUpstream
}

type kaUpstream struct {
	mux *leaseMux
	key string
	md  metadata.MD

	ctx    context.Context
	cancel context.CancelFunc

	mu       sync.Mutex
	clients  map[*kaClient]bool
	waiters  map[int64]map[*kaClient]int
	inflight map[int64]bool
	stream   grpc.ClientStream
	sendMu   sync.Mutex
}

type kaClient struct {
	out    chan *pb.LeaseKeepAliveResponse
	ctx    context.Context
	cancel context.CancelCauseFunc
}

func newLeaseMux(p *Proxy) *leaseMux {
	ctx, cancel := context.WithCancel(context.Background())
	return &leaseMux{p: p, ctx: ctx, cancel: cancel, ups: map[string]*kaUpstream{}}
}

func (lm *leaseMux) close() {
	lm.cancel()
	lm.wg.Wait()
}

// serve handles one client LeaseKeepAlive stream.
func (lm *leaseMux) serve(ss grpc.ServerStream) error {
	p := lm.p
	if p.cfg.Mode == ReadOnly {
		p.m.refused.WithLabelValues(leaseSvc + "LeaseKeepAlive").Inc()
		return readonlyError(leaseSvc + "LeaseKeepAlive")
	}
	if _, err := p.outgoing(ss.Context(), leaseSvc+"LeaseKeepAlive"); err != nil {
		return err
	}
	if p.dir.availableCount() == 0 {
		return p.noEndpointsError(nil)
	}
	in, _ := metadata.FromIncomingContext(ss.Context())
	md := metadata.MD{}
	for _, k := range []string{rpctypes.TokenFieldNameGRPC, "authorization"} {
		if v := in.Get(k); len(v) > 0 {
			md.Set(k, v...)
		}
	}
	md.Set(viaKey, append(in.Get(viaKey), p.id)...)
	key := strings.Join(md.Get(rpctypes.TokenFieldNameGRPC), ",") + "|" + strings.Join(md.Get("authorization"), ",") + "|" + strings.Join(md.Get(viaKey), ",")

	ctx, cancel := context.WithCancelCause(ss.Context())
	defer cancel(nil)
	c := &kaClient{out: make(chan *pb.LeaseKeepAliveResponse, kaQueue), ctx: ctx, cancel: cancel}
	up := lm.acquire(key, md, c)
	if up == nil {
		return status.Error(codes.Unavailable, "proxy: closing")
	}
	defer up.release(c)
	p.m.kaClientStreams.Inc()
	defer p.m.kaClientStreams.Dec()

	go func() {
		for {
			req := new(pb.LeaseKeepAliveRequest)
			if err := ss.RecvMsg(req); err != nil {
				if errors.Is(err, io.EOF) {
					cancel(nil)
				} else {
					cancel(err)
				}
				return
			}
			p.m.kaRequests.Inc()
			up.request(req.ID, c)
		}
	}()
	for {
		select {
		case <-ctx.Done():
			if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
				return err
			}
			return nil
		case r := <-c.out:
			if err := ss.SendMsg(r); err != nil {
				return err
			}
		}
	}
}

// acquire returns the upstream for key, starting it if needed.
func (lm *leaseMux) acquire(key string, md metadata.MD, c *kaClient) *kaUpstream {
	lm.mu.Lock()
	defer lm.mu.Unlock()
	if lm.ctx.Err() != nil {
		return nil
	}
	up := lm.ups[key]
	if up == nil {
		ctx, cancel := context.WithCancel(metadata.NewOutgoingContext(lm.ctx, md))
		up = &kaUpstream{mux: lm, key: key, md: md, ctx: ctx, cancel: cancel,
			clients: map[*kaClient]bool{}, waiters: map[int64]map[*kaClient]int{}, inflight: map[int64]bool{}}
		lm.ups[key] = up
		lm.wg.Go(up.run)
	}
	up.mu.Lock()
	up.clients[c] = true
	up.mu.Unlock()
	return up
}

// release forgets c; the last client stops the upstream stream.
func (up *kaUpstream) release(c *kaClient) {
	lm := up.mux
	lm.mu.Lock()
	up.mu.Lock()
	delete(up.clients, c)
	for id, ws := range up.waiters {
		delete(ws, c)
		if len(ws) == 0 {
			delete(up.waiters, id)
		}
	}
	last := len(up.clients) == 0
	up.mu.Unlock()
	if last && lm.ups[up.key] == up {
		delete(lm.ups, up.key)
		up.cancel()
	}
	lm.mu.Unlock()
}

// request forwards a keep-alive for id unless one is already in flight.
func (up *kaUpstream) request(id int64, c *kaClient) {
	up.mu.Lock()
	if !up.clients[c] {
		up.mu.Unlock() // the client's stream has ended
		return
	}
	ws := up.waiters[id]
	if ws == nil {
		ws = map[*kaClient]int{}
		up.waiters[id] = ws
	}
	ws[c]++
	send := !up.inflight[id] && up.stream != nil
	if send {
		up.inflight[id] = true
	}
	stream := up.stream
	up.mu.Unlock()
	if send {
		up.send(stream, id)
	}
}

func (up *kaUpstream) send(stream grpc.ClientStream, id int64) {
	up.sendMu.Lock()
	err := stream.SendMsg(&pb.LeaseKeepAliveRequest{ID: id})
	up.sendMu.Unlock()
	if err == nil {
		up.mux.p.m.kaForwarded.Inc()
	}
	// On error the receive side sees the failure and reopens the stream,
	// resending every waiting request.
}

// run keeps one upstream stream open while clients remain, reopening it
// (on another endpoint) after a failure.
func (up *kaUpstream) run() {
	p := up.mux.p
	backoff := 50 * time.Millisecond
	for up.ctx.Err() == nil {
		sctx, scancel := context.WithCancel(up.ctx)
		var pr peer.Peer
		cs, err := p.conns[0].NewStream(sctx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
			leaseSvc+"LeaseKeepAlive", grpc.ForceCodecV2(p.codec), grpc.Peer(&pr))
		if err != nil {
			scancel()
			if p.dir.availableCount() == 0 {
				up.failAll(p.noEndpointsError(err))
			}
			select {
			case <-up.ctx.Done():
				return
			case <-time.After(backoff):
			}
			backoff = min(2*backoff, time.Second)
			continue
		}
		p.m.kaUpstreams.Inc()
		up.mu.Lock()
		up.stream = cs
		clear(up.inflight)
		var resend []int64
		for id := range up.waiters {
			up.inflight[id] = true
			resend = append(resend, id)
		}
		up.mu.Unlock()
		for _, id := range resend {
			up.send(cs, id)
		}
		answered := false
		for {
			resp := new(pb.LeaseKeepAliveResponse)
			if err := cs.RecvMsg(resp); err != nil {
				if isTransportError(err) && pr.Addr != nil {
					p.dir.fail(pr.Addr.String(), err)
				}
				if credentialError(err) { // security.go
					// The clients' token expired or their credentials
					// changed: reopening with it would fail forever and the
					// leases would expire silently. End their streams with
					// etcd's error instead, so that they authenticate again
					// and reopen with their new token.
					scancel()
					up.retire(err)
					return
				}
				if refusal(err) {
					// etcd refused one of the keep-alives in flight (a
					// lease whose keys the user may not write) and ended
					// the stream: resending them would be refused again,
					// at once, forever, while their clients heard nothing.
					// Their clients get etcd's error, as from etcd.
					up.refuseInflight(err)
				}
				break
			}
			answered = true
			up.deliver(resp)
		}
		up.mu.Lock()
		up.stream = nil
		up.mu.Unlock()
		scancel()
		p.m.kaUpstreams.Dec()
		// A stream that ended before any answer is opened again only after
		// a pause that grows, so that a failing one is not retried in a
		// tight loop.
		if answered {
			backoff = 50 * time.Millisecond
			continue
		}
		select {
		case <-up.ctx.Done():
			return
		case <-time.After(backoff):
		}
		backoff = min(2*backoff, time.Second)
	}
}

// refusal reports whether etcd ended a keep-alive stream because it
// refused a request on it (a status of its own, not a transport failure
// or the member going away).
func refusal(err error) bool {
	switch status.Code(err) {
	case codes.PermissionDenied, codes.InvalidArgument, codes.FailedPrecondition, codes.NotFound, codes.OutOfRange:
		return true
	}
	return false
}

// refuseInflight ends, with err, the client streams waiting for a
// keep-alive that was sent upstream and not answered when etcd refused
// one: etcd answers in order, so the refused one is among them. A client
// sharing the upstream whose keep-alive was merely in flight too sees the
// error and reopens its stream, as clientv3 does.
func (up *kaUpstream) refuseInflight(err error) {
	up.mu.Lock()
	var cs []*kaClient
	for id := range up.inflight {
		for c := range up.waiters[id] {
			cs = append(cs, c)
		}
		delete(up.waiters, id)
	}
	clear(up.inflight)
	up.mu.Unlock()
	for _, c := range cs {
		c.cancel(err)
	}
}

// deliver sends resp to every client waiting for its lease.
func (up *kaUpstream) deliver(resp *pb.LeaseKeepAliveResponse) {
	up.mu.Lock()
	ws := up.waiters[resp.ID]
	delete(up.waiters, resp.ID)
	delete(up.inflight, resp.ID)
	up.mu.Unlock()
	for c, n := range ws {
		for range n {
			select {
			case c.out <- resp:
			default:
				c.cancel(status.Error(codes.ResourceExhausted, "proxy: lease keep-alive stream too slow; reopen it"))
			}
		}
	}
}

// failAll ends every client stream with err.
func (up *kaUpstream) failAll(err error) {
	up.mu.Lock()
	cs := make([]*kaClient, 0, len(up.clients))
	for c := range up.clients {
		cs = append(cs, c)
	}
	up.mu.Unlock()
	for _, c := range cs {
		c.cancel(err)
	}
}
