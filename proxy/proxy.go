package proxy

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"golang.org/x/sync/singleflight"
	"log/slog"
	"math"
	"net"
	"net/http"
	"net/url"
	"runtime"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
	"google.golang.org/grpc/backoff"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"
)

// Proxy is an etcd v3 proxy: one listener serving the etcd gRPC API and
// its JSON gateway, /metrics and /health, forwarding to the members of one
// cluster. Create it with New, run it with Serve or Run, stop it with
// Close or by cancelling the context.
// Lock order: mu, streamsMu, finding.mu and anon.mu are never held together, nor under another lock.
type Proxy struct {
	cfg        Config
	log        *slog.Logger
	reg        *prometheus.Registry
	m          *metrics
	id         string
	codec      codec
	watchQueue int // responses a client watch stream may have waiting
	// watchQueueBytes bounds the encoded events waiting for one stream.
	watchQueueBytes int
	forceCodec      grpc.CallOption
	httpClient      *http.Client
	dir             *director
	watchChecks     singleflight.Group // mayWatch's checks in flight
	// httpTimeout bounds reading a gateway request and writing a unary
	// answer (httpRequestTimeout); idleTimeout closes connections without
	// requests (httpIdleTimeout).
	httpTimeout, idleTimeout time.Duration

	mu    sync.Mutex
	state int
	stop  context.CancelFunc
	done  chan struct{}
	ready chan struct{}
	addr  net.Addr

	// started is set once the cluster was found and everything below is
	// in place: until then every request is answered with notReady.
	started atomic.Bool
	// streams counts the client streams open (limits.go), streamsBy
	// those of each client address and kind.
	streams   atomic.Int64
	streamsMu sync.Mutex
	streamsBy map[clientKind]*clientStreams
	finding   finding // what finding the cluster has tried (start)
	warned    *onceLog
	// refreshLog bounds the lines of a member list refresh that keeps
	// failing (every second while no endpoint is usable).
	refreshLog *failLog

	// Set by Serve before it serves.
	client *clientv3.Client   // watches, member list
	pool   *pool              // forwarding
	conns  []*grpc.ClientConn // pool.conns
	next   atomic.Uint32
	watch  *watchHub
	hubRef atomic.Pointer[watchHub] // watch, for the director's callback
	cache  *rangeCache              // nil when turned off
	lease  *leaseMux
	self   *selfMatcher
	anon   anonGuard // anonymous.go
	seeds  []string  // peer URLs from discovery
	peers  []string  // peer URLs from the last member list
}

// finding is what the proxy tried while it looks for the cluster at
// start, for the answers it gives meanwhile.
type finding struct {
	mu        sync.Mutex
	since     time.Time
	attempts  int
	lastErr   error
	endpoints []EndpointStatus // the member endpoints of the last attempt
}

const (
	stateNew = iota
	stateServing
	stateClosed
)

// New checks cfg and returns a proxy ready to Serve. It starts nothing.
func New(cfg Config) (*Proxy, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	mode, _ := ParseMode(string(cfg.Mode))
	cfg.Mode = mode
	reg := cfg.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	m, err := newMetrics(reg)
	if err != nil {
		return nil, fmt.Errorf("%w: register metrics: %v", ErrInvalidConfig, err)
	}
	var idb [6]byte
	_, _ = rand.Read(idb[:])
	log := cfg.Logger.With("component", "proxy")
	p := &Proxy{
		httpTimeout:     httpRequestTimeout,
		idleTimeout:     httpIdleTimeout,
		cfg:             cfg,
		log:             log,
		reg:             reg,
		m:               m,
		id:              hex.EncodeToString(idb[:]),
		codec:           newCodec(),
		watchQueue:      maxQueued,
		watchQueueBytes: maxQueuedBytes,
		forceCodec:      grpc.ForceCodecV2(newCodec()),
		httpClient:      newHTTPClient(cfg.ClientTLS, cfg.DialTimeout),
		dir:             newDirector(cfg.FailureWait, log, m),
		warned:          newOnceLog(),
		refreshLog:      newFailLog(),
		done:            make(chan struct{}),
		ready:           make(chan struct{}),
	}
	if cfg.CacheMaxStaleness > 0 {
		p.cache = newRangeCache(p)
	}
	if err := p.registerCacheMetrics(reg); err != nil {
		return nil, fmt.Errorf("%w: register metrics: %v", ErrInvalidConfig, err)
	}
	return p, nil
}

// Mode returns the proxy's mode.
func (p *Proxy) Mode() Mode { return p.cfg.Mode }

// Ready is closed once the proxy has found the cluster and forwards
// requests. Before, from the moment Serve is called, it answers on its
// listener: /health with 503 and every request with gRPC Unavailable (HTTP
// 503) saying that no reachable member was found yet and what was tried.
func (p *Proxy) Ready() <-chan struct{} { return p.ready }

// Done is closed when Serve has returned.
func (p *Proxy) Done() <-chan struct{} { return p.done }

// Addr returns the listener's address (nil before Serve).
func (p *Proxy) Addr() net.Addr {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.addr
}

// Endpoints reports the member endpoints and their state; before the
// proxy is ready, those its last attempt to find the cluster tried.
func (p *Proxy) Endpoints() []EndpointStatus {
	if !p.started.Load() {
		p.finding.mu.Lock()
		defer p.finding.mu.Unlock()
		return slices.Clone(p.finding.endpoints)
	}
	return p.dir.status()
}

// notReady is the error of a request that comes before the proxy has
// found the cluster (nil once it has): Unavailable, so that clients retry
// or go to another endpoint, saying what finding the cluster has tried.
func (p *Proxy) notReady() error {
	if p.started.Load() {
		return nil
	}
	return status.Error(codes.Unavailable, p.notReadyReason())
}

func (p *Proxy) notReadyReason() string {
	f := &p.finding
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.since.IsZero() {
		return fmt.Sprintf("%v: not serving (Serve was not called)", ErrNotReady)
	}
	bound := fmt.Sprintf("of at most %v", p.cfg.StartTimeout)
	if p.cfg.StartTimeout < 0 {
		bound = "with no bound"
	}
	msg := fmt.Sprintf("%v: no reachable etcd member found yet %s (looking for %v %s", ErrNotReady,
		p.cfg.source(), time.Since(f.since).Round(100*time.Millisecond), bound)
	if f.attempts == 0 || f.lastErr == nil {
		return msg + "; the first attempt is under way)"
	}
	attempts := "attempts"
	if f.attempts == 1 {
		attempts = "attempt"
	}
	return fmt.Sprintf("%s, %d %s); last attempt: %v", msg, f.attempts, attempts, f.lastErr)
}

// Run listens on Config.ListenAddr and serves until ctx ends or Close.
func (p *Proxy) Run(ctx context.Context) error {
	l, err := net.Listen("tcp", p.cfg.ListenAddr)
	if err != nil {
		return fmt.Errorf("proxy: listen on %s: %w", p.cfg.ListenAddr, err)
	}
	return p.Serve(ctx, l)
}

// Serve answers on l at once and finds the cluster (bounded by
// Config.StartTimeout, if positive), then forwards clients' requests until ctx ends or
// Close is called; it closes l. Until the cluster is found, /health answers
// 503 and every request gRPC Unavailable (HTTP 503) saying so (see Ready).
// It returns nil after a normal stop (ctx ended or Close, also while still
// finding the cluster), and an error if the cluster cannot be found within
// StartTimeout, the configuration cannot work, or serving fails. After
// start, failures only fail the requests they touch.
func (p *Proxy) Serve(ctx context.Context, l net.Listener) error {
	p.mu.Lock()
	switch p.state {
	case stateServing:
		p.mu.Unlock()
		return ErrServing
	case stateClosed:
		p.mu.Unlock()
		_ = l.Close()
		return ErrClosed
	}
	p.state = stateServing
	ctx, cancel := context.WithCancel(ctx)
	p.stop = cancel
	p.addr = l.Addr()
	p.mu.Unlock()
	defer close(p.done)
	defer cancel()
	defer p.httpClient.CloseIdleConnections()

	p.self = newSelfMatcher(l.Addr(), p.cfg.SelfAddrs)
	defer func() {
		// start connected, even if serving ended before it was done.
		if p.pool != nil {
			p.pool.close()
		}
		if p.client != nil {
			_ = p.client.Close()
		}
	}()
	return p.serve(ctx, l)
}

// Close stops the proxy and waits (boundedly) for Serve to return. It is
// safe to call more than once and before Serve.
func (p *Proxy) Close() error {
	p.mu.Lock()
	p.state = stateClosed
	stop := p.stop
	p.mu.Unlock()
	if stop == nil {
		return nil // Serve never started
	}
	stop()
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		return errors.New("proxy: close timed out waiting for connections to end")
	}
	return nil
}

// start finds the cluster and connects to it. Each attempt is recorded
// for the answers the proxy gives meanwhile (notReady, /proxy/endpoints),
// and the retries are logged at a bounded rate.
func (p *Proxy) start(ctx context.Context) error {
	sctx, cancel := ctx, context.CancelFunc(func() {})
	if p.cfg.StartTimeout > 0 {
		sctx, cancel = context.WithTimeout(ctx, p.cfg.StartTimeout)
	}
	defer cancel()
	var lastErr error
	delay := 100 * time.Millisecond
	flog := newFailLog()
	for {
		list, err := p.initialEndpoints(sctx)
		p.tried(list, err)
		if err == nil {
			usable := 0
			self := 0
			for _, e := range list {
				switch {
				case e.self:
					self++
				case e.usable(time.Now()):
					usable++
				}
			}
			switch {
			case len(list) > 0 && self == len(list):
				return fmt.Errorf("%w: every member client URL is this proxy's own address %s (a loop); point the proxy at the cluster", ErrInvalidConfig, p.addr)
			case usable > 0:
				if attrs, failed := flog.ok(); failed {
					p.log.Info("cluster reachable", attrs...)
				}
				p.dir.replace(list)
				return p.connect(list)
			}
			var errs []error
			for _, e := range list {
				if !e.self {
					errs = append(errs, fmt.Errorf("%s: %s", e.url, e.lastErr))
				}
			}
			err = fmt.Errorf("%w: no member client URL reachable: %w", ErrNoMembers, errors.Join(errs...))
		}
		lastErr = err
		if isPermanent(err) {
			return err
		}
		p.finding.mu.Lock()
		p.finding.lastErr = err
		p.finding.mu.Unlock()
		lvl, attrs := flog.failed()
		p.log.Log(ctx, lvl, "cluster not reachable yet; retrying (requests are answered Unavailable meanwhile)", append(attrs, "err", err)...)
		select {
		case <-sctx.Done():
			if ctx.Err() != nil {
				return ctx.Err()
			}
			return fmt.Errorf("proxy: no usable etcd cluster found within %v: %w", p.cfg.StartTimeout, lastErr)
		case <-time.After(delay):
		}
		delay = min(2*delay, time.Second)
	}
}

// tried records an attempt to find the cluster: the endpoints it probed
// (none when discovery or the member list failed).
func (p *Proxy) tried(list []*endpoint, err error) {
	now := time.Now()
	eps := make([]EndpointStatus, 0, len(list))
	for _, e := range list {
		s := EndpointStatus{URL: e.url, State: e.state(now), LastError: e.lastErr}
		if s.State == "failed" {
			s.Until = e.failedUntil
		}
		eps = append(eps, s)
	}
	f := &p.finding
	f.mu.Lock()
	defer f.mu.Unlock()
	f.attempts++
	if err != nil || len(list) > 0 {
		f.endpoints = eps
	}
}

// initialEndpoints runs discovery and reads the member list.
func (p *Proxy) initialEndpoints(ctx context.Context) ([]*endpoint, error) {
	var urls []string
	if len(p.cfg.Endpoints) > 0 {
		urls = p.cfg.Endpoints
	} else {
		if p.seeds == nil {
			seeds, err := p.discoverPeers(ctx)
			if err != nil {
				return nil, err
			}
			if _, err := parseURLs(seeds); err != nil {
				return nil, permanent(err)
			}
			p.seeds = seeds
			p.log.Info("found cluster peers", "peers", seeds)
		}
		ms, err := p.fetchMembers(ctx, p.seeds)
		if err != nil {
			return nil, err
		}
		clients, peers := clientURLs(ms)
		if len(clients) == 0 {
			return nil, fmt.Errorf("%w: the member list names no client URL yet", ErrNoMembers)
		}
		p.peers = peers
		urls = clients
	}
	return probe(ctx, urls, p.self, p.cfg.ClientTLS, p.cfg.DialTimeout, p.cfg.FailureWait, p.log, p.warned), nil
}

// connect creates the upstream client over the usable endpoints.
func (p *Proxy) connect(list []*endpoint) error {
	var eps []string
	for _, e := range list {
		if e.usable(time.Now()) {
			eps = append(eps, e.url)
		}
	}
	cli, err := p.etcdClient(eps)
	if err != nil {
		return fmt.Errorf("proxy: connect to %v: %w", eps, err)
	}
	pl, err := newPool(p.cfg.UpstreamConns, eps, p.cfg.ClientTLS, p.cfg.DialTimeout)
	if err != nil {
		_ = cli.Close()
		return fmt.Errorf("proxy: connect to %v: %w", eps, err)
	}
	p.client, p.pool, p.conns = cli, pl, pl.conns
	p.dir.mu.Lock()
	p.dir.applied = slices.Clone(eps)
	p.dir.set = func(eps []string) {
		p.log.Info("endpoints in use", "endpoints", eps)
		cli.SetEndpoints(eps...)
		pl.set(eps)
		if h := p.watchHub(); h != nil {
			h.kickMember() // the watches leave a member that is gone
		}
	}
	p.dir.revive = func() {
		pl.resetBackoff()
		cli.ActiveConnection().ResetConnectBackoff()
	}
	p.dir.mu.Unlock()
	p.log.Info("connected to cluster", "endpoints", eps, "mode", p.cfg.Mode)
	return nil
}

// etcdClient is a clientv3 client of eps, as the proxy dials every
// member: keep-alive pings every 10 s (5 s to answer), reconnects backing
// off from 100 ms to 2 s, messages up to maxMsgSize.
func (p *Proxy) etcdClient(eps []string) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{
		Endpoints:            eps,
		DialTimeout:          p.cfg.DialTimeout,
		DialKeepAliveTime:    10 * time.Second,
		DialKeepAliveTimeout: 5 * time.Second,
		TLS:                  p.cfg.ClientTLS,
		Logger:               zap.NewNop(),
		MaxCallSendMsgSize:   maxMsgSize,
		MaxCallRecvMsgSize:   maxMsgSize,
		DialOptions: []grpc.DialOption{
			grpc.WithConnectParams(grpc.ConnectParams{
				Backoff:           backoff.Config{BaseDelay: 100 * time.Millisecond, Multiplier: 1.6, Jitter: 0.2, MaxDelay: 2 * time.Second},
				MinConnectTimeout: p.cfg.DialTimeout,
			}),
		},
	})
}

// newGRPCServer returns the client-facing gRPC server; marks, if not nil,
// marks each call in flight on its connection (limitConns).
func (p *Proxy) newGRPCServer(marks stats.Handler) *grpc.Server {
	opts := []grpc.ServerOption{
		grpc.ForceServerCodecV2(p.codec),
		// Reused stream workers keep their grown stacks.
		grpc.NumStreamWorkers(uint32(4 * runtime.GOMAXPROCS(0))),
		grpc.UnknownServiceHandler(p.handleUnknown),
		// Unary methods check in unaryHandler (a MethodHandler of its
		// own, which interceptors do not wrap).
		grpc.ChainStreamInterceptor(p.limitStreams, p.readyStream, p.anonymousStream), // limits.go, forward.go, anonymous.go
		grpc.MaxRecvMsgSize(p.cfg.maxRecvBytes()),                                     // limits.go
		grpc.MaxSendMsgSize(maxMsgSize),
		grpc.MaxConcurrentStreams(math.MaxUint32),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: false}),
		// A connection must finish its HTTP/2 handshake within the time a
		// gateway request has for its header, and one without any call
		// for the gateway's idle time is closed (GOAWAY: clients reconnect
		// at their next call): neither was bounded, so one client could
		// hold any number of idle connections, and the file descriptors
		// the proxy needs for its members (limits.go).
		grpc.ConnectionTimeout(headerTimeout),
		grpc.KeepaliveParams(keepalive.ServerParameters{Time: 2 * time.Hour, Timeout: 20 * time.Second, MaxConnectionIdle: p.idleTimeout}),
	}
	if marks != nil {
		opts = append(opts, grpc.StatsHandler(marks))
	}
	gs := grpc.NewServer(opts...)
	for _, d := range p.serviceDescs() {
		switch d.ServiceName {
		case "etcdserverpb.Lease":
			d.Streams = append(d.Streams, grpc.StreamDesc{
				StreamName: "LeaseKeepAlive", ServerStreams: true, ClientStreams: true,
				Handler: func(_ any, ss grpc.ServerStream) error {
					err := p.lease.serve(ss)
					p.m.request(leaseSvc+"LeaseKeepAlive", err)
					return err
				},
			})
		}
		gs.RegisterService(d, p)
	}
	gs.RegisterService(&grpc.ServiceDesc{
		ServiceName: "etcdserverpb.Watch",
		HandlerType: (*any)(nil),
		Streams: []grpc.StreamDesc{{
			StreamName: "Watch", ServerStreams: true, ClientStreams: true,
			Handler: func(_ any, ss grpc.ServerStream) error {
				err := p.watch.serve(ss)
				p.m.request(watchMethod, err)
				return err
			},
		}},
	}, p)
	return gs
}

// refreshLoop re-reads the member list every RefreshInterval (every
// second while no endpoint is usable, and at once, at most every second,
// when a request could connect to no member) and puts benched endpoints
// back in use when their FailureWait is over.
func (p *Proxy) refreshLoop(ctx context.Context) {
	next := time.Now().Add(p.cfg.RefreshInterval)
	var last time.Time // the last refresh
	for {
		interval := p.cfg.RefreshInterval
		if p.dir.availableCount() == 0 && interval > EmptyRefreshInterval {
			interval = EmptyRefreshInterval
			if t := time.Now().Add(interval); t.Before(next) {
				next = t
			}
		}
		wake := next
		if w := p.dir.nextWake(); !w.IsZero() && w.Before(wake) {
			wake = w
		}
		t := time.NewTimer(time.Until(wake))
		select {
		case <-ctx.Done():
			t.Stop()
			return
		case <-t.C:
		case <-p.dir.kick:
			t.Stop()
		}
		if p.dir.recheck.Load() {
			// A request could connect to no member (director.checkNow):
			// refresh now, or EmptyRefreshInterval after the last one.
			if t := last.Add(EmptyRefreshInterval); t.Before(next) {
				next = t
			}
		}
		if !time.Now().Before(next) {
			p.dir.recheck.Store(false)
			p.refresh(ctx)
			last = time.Now()
			next = last.Add(interval)
		} else if urls := p.dir.toReprobe(); len(urls) > 0 {
			// Benched endpoints are used again only once they answer
			// as etcd.
			pctx, cancel := context.WithTimeout(ctx, max(p.cfg.DialTimeout, probeTimeout)+time.Second)
			p.dir.reprobed(probe(pctx, urls, p.self, p.cfg.ClientTLS, p.cfg.DialTimeout, p.cfg.FailureWait, p.log, p.warned))
			cancel()
		}
		p.dir.apply()
	}
}

// refresh re-reads the member list and re-probes the endpoints.
func (p *Proxy) refresh(ctx context.Context) {
	ctx, cancel := context.WithTimeout(ctx, max(5*time.Second, 2*p.cfg.DialTimeout))
	defer cancel()
	urls, err := p.memberClientURLs(ctx)
	if err != nil {
		p.m.refreshes.WithLabelValues("error").Inc()
		lvl, attrs := p.refreshLog.failed()
		p.log.Log(ctx, lvl, "member list refresh failed; keeping the known endpoints", append(attrs, "err", err)...)
		urls = p.dir.known()
	} else {
		p.m.refreshes.WithLabelValues("ok").Inc()
		if attrs, failed := p.refreshLog.ok(); failed {
			p.log.Info("member list refresh works again", attrs...)
		}
	}
	list := probe(ctx, urls, p.self, p.cfg.ClientTLS, p.cfg.DialTimeout, p.cfg.FailureWait, p.log, p.warned)
	before := p.dir.known()
	p.dir.replace(list)
	if after := p.dir.known(); !sameSet(before, after) {
		p.log.Info("member endpoints changed", "before", before, "after", after)
	}
}

// memberClientURLs reads the current members' client URLs. It asks the
// cluster itself first (a linearizable MemberList through the upstream
// connection, answered by a quorum), and only when that fails, or the
// proxy was given no client URLs, the peers' /members pages. Peer pages
// alone can go stale for good: a member removed from the cluster may keep
// answering with the membership it last knew, itself included.
func (p *Proxy) memberClientURLs(ctx context.Context) ([]string, error) {
	// Bounded apart, so that the peers still get their turn when no member
	// answers through the client connection.
	mctx, cancel := context.WithTimeout(ctx, max(2*p.cfg.DialTimeout, time.Second))
	resp, err := p.client.MemberList(mctx)
	cancel()
	if err == nil {
		var clients, peers []string
		for _, m := range resp.Members {
			peers = append(peers, m.PeerURLs...)
			if !m.IsLearner {
				clients = append(clients, m.ClientURLs...)
			}
		}
		clients = p.dialable(clients)
		if len(clients) > 0 {
			if len(p.cfg.Endpoints) == 0 {
				p.peers = peers
			}
			return clients, nil
		}
		err = errors.New("member list names no client URL the proxy can dial")
	}
	if len(p.cfg.Endpoints) > 0 {
		return nil, err
	}
	seen := map[string]bool{}
	var peers []string
	for _, u := range append(slices.Clone(p.peers), p.seeds...) {
		if !seen[u] {
			seen[u] = true
			peers = append(peers, u)
		}
	}
	ms, perr := p.fetchMembers(ctx, peers)
	if perr != nil {
		return nil, fmt.Errorf("member list through the cluster: %w; through peer URLs: %w", err, perr)
	}
	clients, newPeers := clientURLs(ms)
	if clients = p.dialable(clients); len(clients) == 0 {
		return nil, errors.New("member list names no client URL the proxy can dial")
	}
	p.peers = newPeers
	return clients, nil
}

// dialable leaves out the client URLs no one can dial: port 0, which a
// member advertises when it listens on a port chosen at start and was told
// no advertise URL. Replacing working endpoints with them left the proxy
// with none (a 100,000-watch bench run, at its first refresh). Each is
// warned about once.
func (p *Proxy) dialable(urls []string) []string {
	out := urls[:0:0]
	for _, u := range urls {
		if pu, err := url.Parse(u); err == nil && pu.Port() == "0" {
			p.log.Log(context.Background(), p.warned.level("port 0", u), "a member advertises a client URL with port 0, "+
				"which nobody can dial; leaving it out (give the member its real port in its advertised client URLs)", "url", u)
			continue
		}
		out = append(out, u)
	}
	return out
}

// watchHub returns the watch hub once serving (nil before).
func (p *Proxy) watchHub() *watchHub { return p.hubRef.Load() }

// Stats are the proxy's current counts (also exported as metrics).
type Stats struct {
	// ClientWatchers are watchers clients hold on the proxy;
	// UpstreamWatches are the watches the proxy holds on etcd for them.
	ClientWatchers, UpstreamWatches int
	// ClientWatchStreams are clients' Watch streams.
	ClientWatchStreams int
	// KeepAliveClientStreams share KeepAliveUpstreamStreams.
	KeepAliveClientStreams, KeepAliveUpstreamStreams int
	// AvailableEndpoints are the endpoints in use.
	AvailableEndpoints int
}

// Stats returns the current counts.
func (p *Proxy) Stats() Stats {
	return Stats{
		ClientWatchers:           gaugeValue(p.m.clientWatchers),
		UpstreamWatches:          gaugeValue(p.m.upstreamWatches),
		ClientWatchStreams:       gaugeValue(p.m.watchStreams),
		KeepAliveClientStreams:   gaugeValue(p.m.kaClientStreams),
		KeepAliveUpstreamStreams: gaugeValue(p.m.kaUpstreams),
		AvailableEndpoints:       p.dir.availableCount(),
	}
}
