package xdsapi

import (
	"context"
	"errors"
	"io"
	"log/slog"
	"net"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/grpcstop"
	"github.com/beaconplane/beacon/internal/setting"
	"github.com/beaconplane/beacon/registry"
	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/keepalive"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Server serves the instances of a registry as xDS resources over ADS,
// state of the world (what proxyless gRPC clients and Envoy speak). It
// follows one Watch of everything the registry holds, builds each
// service's resources once per change, and pushes them to the streams that
// follow that service.
//
// Create it with New; Register it on a gRPC server, or Serve it on a
// listener; Close stops it.
type Server struct {
	discoveryv3.UnimplementedAggregatedDiscoveryServiceServer

	cfg Config
	log *slog.Logger
	m   *metrics
	idx *index
	// readNames: the registry serves names its writers do not write (the
	// dynamo layout), which resource names may then hold (parseName).
	readNames bool

	cancel context.CancelFunc
	done   chan struct{} // closed when Close begins: streams end
	wg     sync.WaitGroup

	// mu guards the stream counts and the gRPC servers (never held with
	// the index's lock).
	mu       sync.Mutex
	streams  int
	perPeer  map[string]int
	namesPer map[string]int // names subscribed by the streams of each client address
	servers  []*grpc.Server
	closed   bool
	once     sync.Once
}

var _ discoveryv3.AggregatedDiscoveryServiceServer = (*Server)(nil)

// New validates cfg and starts following d. Until the registry's first
// snapshot is in (Ready), streams are accepted but answered nothing, so
// that no client is told a service is empty when it is not.
func New(d registry.Discoverer, cfg Config) (*Server, error) {
	if d == nil {
		return nil, errors.New("xdsapi: a registry is required")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	s := &Server{cfg: cfg, log: cfg.Logger.With("component", "xds"), perPeer: map[string]int{}, namesPer: map[string]int{}, done: make(chan struct{}),
		readNames: registry.LayoutOf(d) == registry.LayoutDynamo}
	m, err := newMetrics(cfg.Metrics, s)
	if err != nil {
		return nil, err
	}
	s.m = m
	s.idx = newIndex(m)
	ctx, cancel := context.WithCancel(context.Background())
	s.cancel = cancel
	s.wg.Add(1)
	go func() {
		defer s.wg.Done()
		if err := registry.Track(ctx, d, beacon.Query{}, s.apply); err != nil {
			s.log.Warn("xds: the registry was closed; serving the last state, with no more updates", "err", err)
		}
	}()
	return s, nil
}

// apply folds a registry batch into the index.
func (s *Server) apply(b registry.Batch) {
	wasReady := s.idx.isReady()
	since, _ := s.idx.stale()
	if b.Kind == registry.Stale {
		if since.IsZero() {
			s.log.Warn("xds: the registry watch lost its store; clients keep the last state Beacon sent until it is back", "err", b.Err)
		}
		s.idx.markStale(b.Err)
		return
	}
	fresh := s.idx.apply(b)
	switch {
	case !wasReady:
		s.log.Info("xds: first registry snapshot in; answering")
	case !since.IsZero():
		s.log.Info("xds: the registry watch is back; pushing what changed", "stale_for", time.Since(since).Round(time.Millisecond))
	}
	s.logOmitted(fresh)
}

// maxOmittedLogs bounds the instances logged one by one per batch.
const maxOmittedLogs = 10

// logOmitted says which instances a batch left out of xDS (or served with
// a default), and why.
func (s *Server) logOmitted(om []omission) {
	for i, o := range om {
		if i == maxOmittedLogs {
			s.log.Warn("xds: more instances left out of xDS or served with defaults (beacon_xds_omitted_endpoints)", "count", len(om)-i)
			return
		}
		if o.reason == reasonWeight || o.reason == reasonPriority || o.reason == reasonPolicy {
			s.log.Warn("xds: instance metadata ignored", "instance", o.ref.String(), "reason", o.reason, "value", o.value)
			continue
		}
		s.log.Warn("xds: instance left out of xDS", "instance", o.ref.String(), "address", o.addr, "reason", o.reason)
	}
}

// Ready reports whether the registry's first snapshot is in.
func (s *Server) Ready() bool { return s.idx.isReady() }

// Updated returns a channel closed at the next change of what Beacon
// serves (a registry batch applied, or the watch going stale). Take it
// before checking a condition, then wait on it: no change is missed.
func (s *Server) Updated() <-chan struct{} { return s.idx.changes() }

// Stale reports since when the registry watch has been cut off from its
// store (zero while it is live), and why. Clients keep being served the
// last state meanwhile.
func (s *Server) Stale() (time.Time, error) { return s.idx.stale() }

// Register adds the ADS service to a gRPC server the caller runs.
func (s *Server) Register(r grpc.ServiceRegistrar) {
	discoveryv3.RegisterAggregatedDiscoveryServiceServer(r, s)
}

// keepalive settings of Serve's gRPC server: a client that vanished
// without closing its connection is noticed within about 40 s, and a
// connection that holds no stream for a minute is closed (a client keeps
// its ADS stream open); clients may ping as often as every 10 s (C-core
// pings every 5 min).
var (
	serverKeepalive = keepalive.ServerParameters{Time: 30 * time.Second, Timeout: 10 * time.Second, MaxConnectionIdle: time.Minute}
	keepalivePolicy = keepalive.EnforcementPolicy{MinTime: 10 * time.Second, PermitWithoutStream: true}
)

// Serve serves ADS on ln with a gRPC server of its own (Config's
// ServerOptions apply) until Close, then returns nil.
func (s *Server) Serve(ln net.Listener) error {
	opts := append([]grpc.ServerOption{
		grpc.ConnectionTimeout(10 * time.Second), // the TLS and HTTP/2 handshakes
		grpc.KeepaliveParams(serverKeepalive),
		grpc.KeepaliveEnforcementPolicy(keepalivePolicy),
	}, s.cfg.ServerOptions...)
	gs := grpc.NewServer(opts...)
	s.Register(gs)
	s.mu.Lock()
	if s.closed {
		s.mu.Unlock()
		_ = ln.Close()
		return nil
	}
	s.servers = append(s.servers, gs)
	s.mu.Unlock()
	err := gs.Serve(ln)
	if errors.Is(err, grpc.ErrServerStopped) {
		return nil
	}
	return err
}

// closeGrace is how long Close lets streams end with their reason (the
// server is shutting down: connect again) before it cuts connections.
const closeGrace = time.Second

// Close ends every stream, telling its client why, and stops following
// the registry. It is idempotent.
func (s *Server) Close() error {
	s.once.Do(func() {
		s.mu.Lock()
		s.closed = true
		servers := s.servers
		s.mu.Unlock()
		close(s.done)
		grpcstop.Stop(context.Background(), closeGrace, servers...)
		s.cancel()
		s.wg.Wait()
	})
	return nil
}

// admit counts a new stream against MaxStreams and MaxStreamsPerClient; the
// release func uncounts it.
func (s *Server) admit(host string) (release func(), err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	switch {
	case s.closed:
		return nil, status.Error(codes.Unavailable, "the xDS server is shutting down: connect again")
	case s.streams >= s.cfg.MaxStreams:
		s.m.refused.WithLabelValues("max_streams").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "this server holds its maximum of %d xDS streams (%s): connect to another server, or raise the bound", s.cfg.MaxStreams, setting.Namer(s.cfg.SettingName).Name("xdsapi.Config.MaxStreams"))
	case s.cfg.MaxStreamsPerClient > 0 && s.perPeer[host] >= s.cfg.MaxStreamsPerClient:
		s.m.refused.WithLabelValues("max_streams_per_client").Inc()
		return nil, status.Errorf(codes.ResourceExhausted, "%s holds %d xDS streams, the most one client address may (%s); a process needs one stream for all its channels", host, s.cfg.MaxStreamsPerClient, setting.Namer(s.cfg.SettingName).Name("xdsapi.Config.MaxStreamsPerClient"))
	}
	s.streams++
	s.perPeer[host]++
	return func() {
		s.mu.Lock()
		defer s.mu.Unlock()
		s.streams--
		if s.perPeer[host]--; s.perPeer[host] == 0 {
			delete(s.perPeer, host)
		}
	}, nil
}

// reserveNames counts delta more (or, negative, fewer) names subscribed
// by a stream of host against MaxNamesPerClient; an error when the bound
// would be passed (nothing is counted then).
func (s *Server) reserveNames(host string, delta int) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	n := s.namesPer[host] + delta
	if limit := s.cfg.MaxNamesPerClient; delta > 0 && limit > 0 && n > limit {
		s.m.refused.WithLabelValues("max_names_per_client").Inc()
		return status.Errorf(codes.ResourceExhausted, "%s would subscribe to %d resource names over its xDS streams, the most one client address may (%s): subscribe with no names, the wildcard, to get every service, or raise the bound",
			host, n, setting.Namer(s.cfg.SettingName).Name("xdsapi.Config.MaxNamesPerClient"))
	}
	if n <= 0 {
		delete(s.namesPer, host)
	} else {
		s.namesPer[host] = n
	}
	return nil
}

// streamCount returns the open streams.
func (s *Server) streamCount() int {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.streams
}

// peerHost returns the client's address without its port.
func peerHost(ctx context.Context) string {
	p, ok := peer.FromContext(ctx)
	if !ok || p.Addr == nil {
		return "unknown"
	}
	if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
		return host
	}
	return p.Addr.String()
}

// StreamAggregatedResources serves one ADS stream, state of the world.
func (s *Server) StreamAggregatedResources(ss discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	ctx := ss.Context()
	host := peerHost(ctx)
	release, err := s.admit(host)
	if err != nil {
		return err
	}
	defer release()
	var access Access
	if s.cfg.Authorize != nil {
		if access, err = s.cfg.Authorize(ctx); err != nil {
			s.m.refused.WithLabelValues("unauthenticated").Inc()
			return err
		}
		if access != nil {
			defer access.Release()
		}
	}
	st := &stream{
		srv: s, ctx: ctx, send: ss.Send, peer: host, access: access,
		wake: make(chan struct{}, 1), types: map[string]*typeState{}, refs: map[service]*[numTypes]int{}, visible: map[string]bool{},
	}
	s.idx.addStream(st)
	defer func() {
		st.mu.Lock()
		subscribed, names := st.subscribed(), st.names
		st.mu.Unlock()
		s.idx.removeStream(st, subscribed)
		_ = s.reserveNames(host, -names)
	}()
	recvErr := make(chan error, 1)
	s.wg.Add(1)
	go func() { // owned by this handler: ends with the stream
		defer s.wg.Done()
		recvErr <- s.receive(st, ss)
	}()
	sent := make(chan error, 1)
	s.wg.Go(func() { sent <- s.run(st, recvErr) }) // ends with the stream too
	return s.watchSends(st, sent)
}

// watchSends waits for the sending loop to end, and ends the stream
// itself when a send has waited AckTimeout: a client that does not read
// (its flow-control window full) blocks Send until the stream ends, which
// only the handler's return brings about, so the ACK deadline, checked
// between sends, never came and such a stream held its place and its
// goroutines for as long as its connection lived.
func (s *Server) watchSends(st *stream, sent <-chan error) error {
	t := time.NewTicker(s.cfg.AckTimeout / 4)
	defer t.Stop()
	for {
		select {
		case err := <-sent:
			return err
		case now := <-t.C:
			if since := st.sendingSince.Load(); since != 0 && now.Sub(time.Unix(0, since)) >= s.cfg.AckTimeout {
				s.m.ackTimeouts.Inc()
				err := status.Errorf(codes.DeadlineExceeded, "a response has waited %v for the client to read it: it does not read its stream", s.cfg.AckTimeout)
				s.log.Warn("xds: stream ended: the client does not read its responses", "node", st.nodeID(), "peer", st.peer, "err", err)
				return err
			}
		}
	}
}

// receive applies the client's requests until the stream ends, waking the
// sending goroutine when one makes a response due.
func (s *Server) receive(st *stream, ss discoveryv3.AggregatedDiscoveryService_StreamAggregatedResourcesServer) error {
	for {
		req, err := ss.Recv()
		if err != nil {
			return err
		}
		st.mu.Lock()
		err = st.handle(req)
		due := st.due()
		st.mu.Unlock()
		if err != nil {
			s.log.Info("xds: stream ended: bad request", "node", st.nodeID(), "peer", st.peer, "err", err)
			return err
		}
		if due {
			st.kick()
		}
	}
}

// run is the stream's sending loop: it sends what the client is owed
// whenever the index, an ACK or a timer says so, until the stream or the
// server ends.
func (s *Server) run(st *stream, recvErr <-chan error) error {
	var retry, ackCheck *time.Timer
	defer func() {
		for _, t := range []*time.Timer{retry, ackCheck} {
			if t != nil {
				t.Stop()
			}
		}
	}()
	for {
		select {
		case err := <-recvErr:
			if errors.Is(err, io.EOF) || status.Code(err) == codes.Canceled {
				return nil
			}
			return err
		case <-st.wake:
		case <-timerC(retry):
		case <-timerC(ackCheck):
		case <-s.done:
			return status.Error(codes.Unavailable, "the xDS server is shutting down: connect again")
		}
		out, wait, err := st.prepare(time.Now())
		if err != nil {
			if status.Code(err) == codes.DeadlineExceeded {
				s.m.ackTimeouts.Inc()
				s.log.Warn("xds: stream ended: the client does not acknowledge responses", "node", st.nodeID(), "peer", st.peer, "err", err)
			}
			return err
		}
		for _, resp := range out {
			if err := st.sendTracked(resp); err != nil {
				return err
			}
			s.m.sentResponse(resp)
		}
		retry = resetTimer(retry, wait.retry)
		ackCheck = resetTimer(ackCheck, wait.ackCheck)
	}
}

// resetTimer arms t (made if nil) to fire after d, or leaves it as it is
// when d is zero.
func resetTimer(t *time.Timer, d time.Duration) *time.Timer {
	if d <= 0 {
		return t
	}
	if t == nil {
		return time.NewTimer(d)
	}
	t.Reset(d)
	return t
}

// DeltaAggregatedResources is not served: proxyless gRPC speaks state of
// the world only, and so does Beacon.
func (s *Server) DeltaAggregatedResources(discoveryv3.AggregatedDiscoveryService_DeltaAggregatedResourcesServer) error {
	return status.Error(codes.Unimplemented, "Beacon serves xDS state of the world over ADS (StreamAggregatedResources), not delta xDS: configure the client for SotW (Envoy: api_type GRPC, not DELTA_GRPC)")
}

// nodeOf reads who a client is from its first request's node.
func (s *Server) nodeOf(n *corev3.Node) nodeInfo {
	return nodeInfo{id: truncate(n.GetId(), 200), cluster: truncate(n.GetCluster(), 200), client: s.m.clientLabel(n.GetUserAgentName()),
		refuses: refusedPolicies(n.GetUserAgentName()), seen: true}
}

// nacked counts and logs a client's refusal of a response.
// A stream's NACKs of a type are logged at WARN at most once per
// nackLogEvery (the rest at DEBUG, with how many went unlogged): one client
// that NACKs every response as fast as it can wrote 5,000 lines (5.7 MB)
// in 0.67 s. The counter counts every one.
func (s *Server) nacked(st *stream, ts *typeState, req *discoveryv3.DiscoveryRequest) {
	typ := typeName(ts.t)
	s.m.nacks.WithLabelValues(typ, st.node.client).Inc()
	level, now := slog.LevelDebug, time.Now()
	if now.Sub(ts.nackWarned) >= nackLogEvery {
		level, ts.nackWarned = slog.LevelWarn, now
	}
	s.log.Log(st.ctx, level, "xds: a client refused (NACKed) a response; it keeps the last version it accepted",
		"type", typ, "node", st.node.id, "client", st.node.client, "peer", st.peer,
		"accepted_version", req.GetVersionInfo(), "nonce", req.GetResponseNonce(),
		"client_error", truncate(req.GetErrorDetail().GetMessage(), 1000), "nacks_not_logged_at_warn", ts.nacksQuiet)
	ts.nacksQuiet++
	if level == slog.LevelWarn {
		ts.nacksQuiet = 0
	}
}

// nackLogEvery bounds the WARN lines of one stream's NACKs of one type.
const nackLogEvery = 10 * time.Second
