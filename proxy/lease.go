package proxy

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
	"sync"
	"sync/atomic"
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
//
// One stream carries every lease of its clients, so the member it runs on
// must not hang it: a member that is stopped or cut off keeps the stream's
// connection open for 15 s or more (gRPC keep-alive), while the clients'
// leases run out. So a keep-alive unanswered for KeepAliveSilenceTimeout
// (etcd answers one in milliseconds) moves the stream to another member,
// with every waiting keep-alive sent again, and the silent member is probed
// and benched unless it answers (in an election every member is slow, and
// none is benched for it).

// kaQueue bounds the answers waiting for one client stream: past it the
// stream is ended as too slow. An answer to a lease the client asked about
// several times in one round trip waits once, with its count.
const kaQueue = 256

// kaAnswer is an answer waiting for a client: resp, owed n times (once
// per request of the client that it answers).
type kaAnswer struct {
	resp *pb.LeaseKeepAliveResponse
	n    int
}

// leaseMux shares one upstream keep-alive stream per member among the
// clients' keep-alive streams. Lock order: leaseMux.mu before
// kaUpstream.mu; kaUpstream.sendMu is held with no other.
type leaseMux struct {
	p      *Proxy
	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	mu  sync.Mutex
	ups map[string]*kaUpstream
}

// kaUpstream is one member's keep-alive stream, shared by the clients of
// a leaseMux. Lock order: leaseMux.mu before mu; sendMu is held with no
// other.
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
	sentAt   map[int64]time.Time // when each keep-alive in flight was sent on stream
	stream   grpc.ClientStream
	member   string // address of stream's member
	sendMu   sync.Mutex
}

type kaClient struct {
	out    chan kaAnswer
	ctx    context.Context
	cancel context.CancelCauseFunc
	slow   atomic.Bool // ended as too slow (counted once)
	// owed counts the client's requests not answered yet; once it has
	// closed its side (sentAll), the stream ends when none is owed.
	owed    atomic.Int64
	sentAll atomic.Bool
}

// requested counts a request of the client, before it is forwarded.
func (c *kaClient) requested() { c.owed.Add(1) }

// answered counts n answers sent to the client; true when the stream is
// done: the client has closed its side and nothing more is owed.
func (c *kaClient) answered(n int) bool {
	return c.owed.Add(-int64(n)) <= 0 && c.sentAll.Load()
}

// closedSend notes that the client has closed its side (the JSON gateway
// does after the request body): the stream goes on until every request
// is answered, as etcd answers each before it reads the next, and ends
// at once if none is owed.
func (c *kaClient) closedSend() {
	c.sentAll.Store(true)
	if c.owed.Load() <= 0 {
		c.cancel(nil)
	}
}

// tooSlow ends a client stream that does not take its answers: more than
// kaQueue wait for it.
func (c *kaClient) tooSlow(p *Proxy) {
	if c.slow.Swap(true) {
		return
	}
	p.m.kaDropped.Inc()
	c.cancel(status.Errorf(codes.ResourceExhausted,
		"proxy: lease keep-alive stream too slow: more than %d answers waited for it; reopen it", kaQueue))
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
	c := &kaClient{out: make(chan kaAnswer, kaQueue), ctx: ctx, cancel: cancel}
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
					c.closedSend()
				} else {
					cancel(err)
				}
				return
			}
			p.m.kaRequests.Inc()
			c.requested()
			up.request(req.ID, c)
		}
	}()
	err := sendAside(ctx, &lm.wg, func() error {
		for {
			select {
			case <-ctx.Done():
				return nil
			case a := <-c.out:
				for range a.n {
					if err := ss.SendMsg(a.resp); err != nil {
						return err
					}
				}
				if c.answered(a.n) {
					return nil
				}
			}
		}
	})
	if err != nil {
		return err
	}
	if err := context.Cause(ctx); err != nil && !errors.Is(err, context.Canceled) && status.Code(err) != codes.Canceled {
		return err
	}
	return nil
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
			clients: map[*kaClient]bool{}, waiters: map[int64]map[*kaClient]int{}, inflight: map[int64]bool{},
			sentAt: map[int64]time.Time{}}
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
		up.sentAt[id] = time.Now()
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
// (on another endpoint) after a failure or a silence.
func (up *kaUpstream) run() {
	backoff := 50 * time.Millisecond
	avoid := "" // a member whose stream went silent
	for up.ctx.Err() == nil {
		sctx, scancel := context.WithCancel(up.ctx)
		cs, addr, err := up.open(sctx, avoid)
		if err != nil {
			scancel()
			if !up.pause(&backoff) {
				return
			}
			continue
		}
		answered, silent := up.serveStream(sctx, scancel, cs, addr)
		scancel()
		avoid = ""
		if silent {
			avoid = addr
		}
		// A stream that ended before any answer is opened again only after
		// a pause that grows, so that a failing one is not retried in a
		// tight loop.
		if answered || silent {
			backoff = 50 * time.Millisecond
			continue
		}
		if !up.pause(&backoff) {
			return
		}
	}
}

// pause waits backoff (doubling it, up to a second); false if the
// upstream ended meanwhile.
func (up *kaUpstream) pause(backoff *time.Duration) bool {
	select {
	case <-up.ctx.Done():
		return false
	case <-time.After(*backoff):
	}
	*backoff = min(2**backoff, time.Second)
	return true
}

// open opens an upstream stream under ctx and returns the address of its
// member. A stream that lands on avoid (a member that just went silent) is
// dropped and opened again, a few times, while another member is
// available.
func (up *kaUpstream) open(ctx context.Context, avoid string) (grpc.ClientStream, string, error) {
	p := up.mux.p
	for attempt := 0; ; attempt++ {
		actx, acancel := context.WithCancel(ctx)
		cs, err := p.conns[0].NewStream(actx, &grpc.StreamDesc{ServerStreams: true, ClientStreams: true},
			leaseSvc+"LeaseKeepAlive", grpc.ForceCodecV2(p.codec))
		if err != nil {
			acancel()
			if p.dir.availableCount() == 0 {
				up.failAll(p.noEndpointsError(err))
			}
			return nil, "", err
		}
		addr := ""
		if pr, ok := peer.FromContext(cs.Context()); ok && pr.Addr != nil {
			addr = pr.Addr.String()
		}
		if avoid == "" || addr != avoid || attempt >= 3 || p.dir.availableCount() < 2 {
			// The stream ends with ctx (actx is its child); acancel is
			// released then.
			context.AfterFunc(ctx, acancel)
			return cs, addr, nil
		}
		acancel() // ends the stream on the member to avoid
	}
}

// serveStream sends every waiting keep-alive on cs and delivers its
// answers until it ends (cancel ends it). It reports whether it delivered
// any answer and whether it ended for a silence.
func (up *kaUpstream) serveStream(ctx context.Context, cancel context.CancelFunc, cs grpc.ClientStream, addr string) (answered, silent bool) {
	p := up.mux.p
	p.m.kaUpstreams.Inc()
	defer p.m.kaUpstreams.Dec()
	up.mu.Lock()
	up.stream, up.member = cs, addr
	clear(up.inflight)
	clear(up.sentAt)
	var resend []int64
	now := time.Now()
	for id := range up.waiters {
		up.inflight[id], up.sentAt[id] = true, now
		resend = append(resend, id)
	}
	up.mu.Unlock()
	for _, id := range resend {
		up.send(cs, id)
	}
	var wasSilent atomic.Bool
	watchDone := make(chan struct{})
	go func() {
		defer close(watchDone)
		wasSilent.Store(up.watchSilence(ctx, addr))
		cancel()
	}()
	defer func() {
		cancel()
		<-watchDone
		up.mu.Lock()
		up.stream, up.member = nil, ""
		up.mu.Unlock()
		silent = wasSilent.Load()
	}()
	for {
		resp := new(pb.LeaseKeepAliveResponse)
		if err := cs.RecvMsg(resp); err != nil {
			if isTransportError(err) && addr != "" {
				p.dir.fail(addr, err)
			}
			if credentialError(err) { // security.go
				// The clients' token expired or their credentials
				// changed: reopening with it would fail forever and the
				// leases would expire silently. End their streams with
				// etcd's error instead, so that they authenticate again
				// and reopen with their new token.
				up.retire(err)
				return answered, false
			}
			if refusal(err) {
				// etcd refused one of the keep-alives in flight (a
				// lease whose keys the user may not write) and ended
				// the stream: resending them would be refused again,
				// at once, forever, while their clients heard nothing.
				// Their clients get etcd's error, as from etcd.
				up.refuseInflight(err)
			}
			return answered, false
		}
		answered = true
		up.deliver(resp)
	}
}

// watchSilence returns true when a keep-alive sent on the stream has gone
// unanswered for KeepAliveSilenceTimeout (the stream must move), after
// having the member probed; false when ctx ends first.
func (up *kaUpstream) watchSilence(ctx context.Context, addr string) bool {
	p := up.mux.p
	timeout := p.cfg.KeepAliveSilenceTimeout
	if timeout <= 0 {
		<-ctx.Done()
		return false
	}
	t := time.NewTicker(max(timeout/4, 10*time.Millisecond))
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return false
		case <-t.C:
		}
		waited := up.oldestWait()
		if waited < timeout {
			continue
		}
		p.m.kaSilences.Inc()
		p.log.Warn("lease keep-alive unanswered on the upstream stream; moving the stream to another member",
			"member", addr, "waited", waited.Round(time.Millisecond))
		if addr != "" {
			up.mux.wg.Go(func() { p.benchIfSilent(addr) })
		}
		return true
	}
}

// oldestWait returns how long the oldest keep-alive in flight on the
// current stream has waited (0: none in flight).
func (up *kaUpstream) oldestWait() time.Duration {
	up.mu.Lock()
	defer up.mu.Unlock()
	var oldest time.Time
	for _, at := range up.sentAt {
		if oldest.IsZero() || at.Before(oldest) {
			oldest = at
		}
	}
	if oldest.IsZero() {
		return 0
	}
	return time.Since(oldest)
}

// benchIfSilent probes the member at addr (within DialTimeout) and
// benches it unless it answers as etcd.
func (p *Proxy) benchIfSilent(addr string) {
	url := p.dir.urlAt(addr)
	if url == "" {
		return
	}
	ctx, cancel := context.WithTimeout(p.lease.ctx, p.cfg.DialTimeout)
	defer cancel()
	if _, err := probeEtcd(ctx, url, p.cfg.ClientTLS); err != nil && p.lease.ctx.Err() == nil {
		p.dir.fail(addr, fmt.Errorf("proxy: a lease keep-alive went unanswered for %v and the member did not answer a probe: %w", p.cfg.KeepAliveSilenceTimeout, err))
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
	clear(up.sentAt)
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
	delete(up.sentAt, resp.ID)
	up.mu.Unlock()
	for c, n := range ws {
		select {
		case c.out <- kaAnswer{resp: resp, n: n}:
		default:
			c.tooSlow(up.mux.p)
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
