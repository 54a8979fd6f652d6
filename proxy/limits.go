package proxy

import (
	"container/list"
	"context"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/internal/pprofhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Defaults of the client-facing limits.
const (
	// DefaultMaxRequestBytes is etcd's --max-request-bytes default: the
	// largest request a member accepts, so the largest the proxy reads.
	DefaultMaxRequestBytes = 1536 * 1024
	// DefaultMaxWatchers and DefaultMaxWatchersPerStream bound the
	// watchers clients open (Config.MaxWatchers).
	DefaultMaxWatchers          = 100_000
	DefaultMaxWatchersPerStream = 10_000
	// DefaultMaxWatchWaitingBytes bounds the events waiting for all
	// client watch streams together (Config.MaxWatchWaitingBytes).
	DefaultMaxWatchWaitingBytes = 1 << 30
	// DefaultMaxStreams bounds the client streams open at once
	// (Config.MaxStreams).
	DefaultMaxStreams = 10_000
	// DefaultMaxStreamsPerClient bounds those of one client address
	// (Config.MaxStreamsPerClient).
	DefaultMaxStreamsPerClient = 1_000
	// DefaultMaxConnsPerClient bounds the connections of one client
	// address (Config.MaxConnsPerClient): an etcd client needs one.
	DefaultMaxConnsPerClient = 1_000
	// grpcOverheadBytes is the allowance for gRPC framing, as etcd adds.
	grpcOverheadBytes = 512 * 1024
	// httpRequestTimeout bounds reading a gateway request's body and
	// writing a unary answer.
	httpRequestTimeout = 30 * time.Second
	// httpIdleTimeout closes idle keep-alive connections of the gateway.
	httpIdleTimeout = 2 * time.Minute
	// maxHeaderBytes bounds a gateway request's header, read within
	// headerTimeout (also the bound of a gRPC connection's handshake).
	maxHeaderBytes = 64 << 10
	headerTimeout  = 10 * time.Second
	// answerGrace is how long after its read deadline a request may still
	// be answered.
	answerGrace = 2 * time.Second
)

// profileHold is how long a profile request (with --pprof) holds its
// connection before it answers.
func (p *Proxy) profileHold(r *http.Request) time.Duration {
	if !p.cfg.EnablePprof || r.Method != http.MethodGet {
		return 0
	}
	return pprofhttp.Hold(r)
}

// limitStreams is the first stream interceptor: it refuses, with
// ResourceExhausted and what to do, a client stream past Config.MaxStreams
// (an empty watch stream costs the proxy two goroutines and gRPC's buffers,
// about 20 KiB: nothing else bounded how many one client could open), and
// keeps the client_streams gauge. Past Config.MaxStreamsPerClient
// streams of one kind, a silent stream of the same address and kind (one
// that has carried no request) makes room for the new one; only if there
// is none is the new one refused.
func (p *Proxy) limitStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	n := p.streams.Add(1)
	cs := newClientStream(ss, p, clientKind{clientAddr(ss.Context()), streamKind(info.FullMethod)})
	defer func() {
		p.streams.Add(-1)
		p.m.clientStreams.Dec()
		p.endStream(cs)
	}()
	p.m.clientStreams.Inc()
	if limit := p.cfg.MaxStreamsPerClient; limit > 0 && !p.admitStream(cs, limit) {
		err := status.Errorf(codes.ResourceExhausted,
			"proxy: %s has %d %s streams open on this proxy, each carrying requests, the most one client address may have of a kind (%s): close the %[3]s streams you no longer need (an etcd client needs one), or raise the limit", cs.key.client, limit, cs.key.kind, p.cfg.setting("proxy.Config.MaxStreamsPerClient"))
		p.refuseStream(ss, info, err)
		return err
	}
	if limit := p.cfg.MaxStreams; limit > 0 && n > int64(limit) {
		err := status.Errorf(codes.ResourceExhausted,
			"proxy: %d client streams are open on this proxy, the most it serves (%s): close watch and keep-alive streams you no longer need (an etcd client needs one of each), or raise the limit", limit, p.cfg.setting("proxy.Config.MaxStreams"))
		p.refuseStream(ss, info, err)
		return err
	}
	return handler(srv, cs)
}

// clientKind is the unit of Config.MaxStreamsPerClient: the streams of
// one kind of one client address. Every process of a host shares its
// address, so one bound for all its streams let a process that opened
// watch streams up to it refuse another's lease keep-alive stream, and
// so cost it its lease; streams of one kind cannot take another's places.
type clientKind struct {
	client string // clientAddr
	kind   string // streamKind
}

// streamKind names the kind of a client stream: "watch" and "lease
// keep-alive" (the two streams an etcd client keeps open), or "other".
func streamKind(fullMethod string) string {
	switch fullMethod {
	case "/etcdserverpb.Watch/Watch":
		return "watch"
	case "/etcdserverpb.Lease/LeaseKeepAlive":
		return "lease keep-alive"
	}
	return "other"
}

// clientStreams are the streams of one clientKind.
type clientStreams struct {
	n      int
	silent list.List // streams that have carried no request, oldest first
}

// clientStream is a client stream counted against its address's bound.
// Its context ends when it is shed to make room for a newer one.
type clientStream struct {
	grpc.ServerStream
	p       *Proxy
	key     clientKind
	ctx     context.Context
	cancel  context.CancelCauseFunc
	spoke   atomic.Bool
	elem    *list.Element // in its key's silent list (guarded by p.streamsMu)
	counted bool          // counted in streamsBy (guarded by p.streamsMu)
}

func newClientStream(ss grpc.ServerStream, p *Proxy, key clientKind) *clientStream {
	ctx, cancel := context.WithCancelCause(ss.Context())
	return &clientStream{ServerStream: ss, p: p, key: key, ctx: ctx, cancel: cancel}
}

func (s *clientStream) Context() context.Context { return s.ctx }

// RecvMsg notes the first request: the stream is no longer silent.
func (s *clientStream) RecvMsg(m any) error {
	err := s.ServerStream.RecvMsg(m)
	if err == nil && !s.spoke.Swap(true) {
		s.p.streamsMu.Lock()
		if s.elem != nil {
			s.p.streamsBy[s.key].silent.Remove(s.elem)
			s.elem = nil
		}
		s.p.streamsMu.Unlock()
	}
	return err
}

// admitStream counts cs against its client's bound for its kind,
// shedding the oldest silent stream of that client and kind if the bound
// is reached; false if it is reached and none is silent.
func (p *Proxy) admitStream(cs *clientStream, limit int) bool {
	p.streamsMu.Lock()
	if p.streamsBy == nil {
		p.streamsBy = map[clientKind]*clientStreams{}
	}
	c := p.streamsBy[cs.key]
	if c == nil {
		c = &clientStreams{}
		c.silent.Init()
		p.streamsBy[cs.key] = c
	}
	var shed *clientStream
	if c.n >= limit {
		e := c.silent.Front()
		if e == nil {
			p.streamsMu.Unlock()
			return false
		}
		shed = e.Value.(*clientStream)
		c.silent.Remove(e)
		shed.elem = nil
	}
	c.n++
	cs.counted = true
	if !cs.spoke.Load() {
		cs.elem = c.silent.PushBack(cs)
	}
	p.streamsMu.Unlock()
	if shed != nil {
		p.m.shedStreams.Inc()
		shed.cancel(status.Errorf(codes.ResourceExhausted,
			"proxy: stream closed to make room: %s has %d %s streams open on this proxy, the most one client address may have of a kind (%s), and this one had carried no request", cs.key.client, limit, cs.key.kind, p.cfg.setting("proxy.Config.MaxStreamsPerClient")))
	}
	return true
}

// endStream takes cs out of its client's count for its kind.
func (p *Proxy) endStream(cs *clientStream) {
	cs.cancel(nil)
	p.streamsMu.Lock()
	defer p.streamsMu.Unlock()
	if !cs.counted {
		return
	}
	c := p.streamsBy[cs.key]
	if cs.elem != nil {
		c.silent.Remove(cs.elem)
		cs.elem = nil
	}
	if c.n--; c.n <= 0 {
		delete(p.streamsBy, cs.key)
	}
}

// gatewayClientKey is the metadata key under which the JSON gateway
// passes its HTTP client's address to the proxy's gRPC server.
const gatewayClientKey = "beacon-proxy-gateway-client"

// clientAddr is the address (host, without the port) of a gRPC call's
// client, the unit of the per-client bounds. A call of the JSON gateway
// (in memory) is its HTTP client's: the last value under
// gatewayClientKey, which the gateway adds after any the HTTP client sent
// itself (Grpc-Metadata-* headers); from any other connection the key is
// ignored.
func clientAddr(ctx context.Context) string {
	pr, ok := peer.FromContext(ctx)
	if !ok || pr.Addr == nil {
		return "unknown"
	}
	if pr.Addr.Network() == "bufconn" {
		md, _ := metadata.FromIncomingContext(ctx)
		if v := md.Get(gatewayClientKey); len(v) > 0 {
			return v[len(v)-1]
		}
	}
	host, _, err := net.SplitHostPort(pr.Addr.String())
	if err != nil {
		return pr.Addr.String()
	}
	return host
}

// maxRecvBytes is the largest gRPC message the proxy accepts from a
// client: a larger one is refused with ResourceExhausted before it is
// buffered, as etcd refuses it.
func (c Config) maxRecvBytes() int {
	return int(c.MaxRequestBytes) + grpcOverheadBytes
}

// maxGatewayBody is the largest JSON gateway body: the JSON form carries
// keys and values in base64 (4/3 of their size) plus field names.
func (c Config) maxGatewayBody() int64 {
	return int64(c.MaxRequestBytes)*2 + grpcOverheadBytes
}

// streamingPaths are the gateway routes that stream (no deadline).
var streamingPaths = map[string]bool{
	"/v3/watch":            true,
	"/v3/lease/keepalive":  true,
	"/v3/election/observe": true,
}

// limitHTTP bounds the gateway's HTTP server: header size and time, idle
// connections, body size, per-request deadlines on every route that does
// not stream, and on a route that streams over HTTP a deadline per write
// (each piece of 64 KiB must be taken within httpTimeout), so that a client
// that stops reading is dropped rather than hold its stream forever; a
// stream upgraded to a websocket keeps the deadlines on its connection.
func (p *Proxy) limitHTTP(hs *http.Server) {
	hs.MaxHeaderBytes = maxHeaderBytes
	hs.IdleTimeout = p.idleTimeout
	hs.ReadHeaderTimeout = headerTimeout
	// TLS handshake failures (an untrusted or expired client certificate,
	// plain text to the TLS port) are logged here.
	hs.ErrorLog = slog.NewLogLogger(p.log.With("component", "proxy-http").Handler(), slog.LevelWarn)
	next := hs.Handler
	limit := p.cfg.maxGatewayBody()
	hs.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if httpapi.RefuseUncleanPath(w, r) {
			return
		}
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		rc := http.NewResponseController(w)
		now := time.Now()
		switch hold := p.profileHold(r); {
		case streamingPaths[r.URL.Path]:
			sw := httpapi.NewStreamWriter(r.Context(), w, p.httpTimeout)
			defer sw.Release()
			w = sw
		case hold > 0:
			// A profile holds the request that long before it answers;
			// the read deadline too, since net/http cancels a request's
			// context when a read deadline passes.
			_ = rc.SetReadDeadline(now.Add(hold + p.httpTimeout))
			_ = rc.SetWriteDeadline(now.Add(hold + p.httpTimeout))
		default:
			// The answer may be written a moment after the body stopped
			// arriving, so that a client too slow to send it is told so.
			_ = rc.SetReadDeadline(now.Add(p.httpTimeout))
			_ = rc.SetWriteDeadline(now.Add(p.httpTimeout + answerGrace))
		}
		next.ServeHTTP(w, r)
	})
}

// limitConns bounds l's client connections (Config.MaxConns, in all, and
// MaxConnsPerClient, per client address; internal/connlimit). The servers
// mark what is in flight on a connection — each gRPC call, stream or
// gateway request — so that a bound reached closes a connection that has
// carried none (a flood of idle ones) or the one idle longest, never one
// in use. Unbounded, a local flood of a thousand idle connections took
// every file descriptor of a proxy run with the common limit of 1,024.
func (p *Proxy) limitConns(l net.Listener) net.Listener {
	if p.cfg.MaxConns < 0 {
		return l
	}
	return connlimit.Listener(l, connlimit.Config{Max: p.cfg.MaxConns, PerAddr: p.cfg.MaxConnsPerClient, Marked: true,
		Log: p.log, What: "proxy"})
}
