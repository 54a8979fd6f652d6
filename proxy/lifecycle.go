package proxy

import (
	"context"
	"errors"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/grpcstop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/test/bufconn"
)

// The proxy's lifecycle, in one place.
//
// serve runs, in order:
//
//	start    servers.start: the gRPC server and the HTTP server (JSON
//	         gateway, /metrics, /health) on the listener, and the
//	         in-memory gRPC server the gateway calls through. They answer
//	         at once: notReady until the cluster is found.
//	find     Proxy.start in its own goroutine (bounded by StartTimeout);
//	         serving can end first (ctx, Close, a server failing), which
//	         stops the search and waits for it.
//	begin    the watch hub on one member, the lease multiplexer, the
//	         refresh loop; Ready is closed.
//	serve    until ctx ends or a server fails.
//	stop     servers.stop (its order below), then what begin started:
//	         the watch hub (every upstream watch; the client streams are
//	         already ended), the lease multiplexer, the refresh loop; last
//	         the split listener's goroutines.
//
// Goroutines: the in-memory gRPC server, the gRPC and HTTP servers and
// the listener split (or the TLS HTTP server) belong to servers; the
// search and the refresh loop to serve; the hub's and the lease mux's to
// them (closed by serve).

// servers is what answers on the proxy's listener.
type servers struct {
	gs        *grpc.Server
	hs        *http.Server
	split     *splitListener // nil with TLS: the HTTP server hands gRPC over
	inner     *bufconn.Listener
	innerDone chan struct{} // the in-memory gRPC server returned
	gconn     *grpc.ClientConn
	errc      chan error // a server that stopped serving
}

// startServers starts the servers on l; on error, l is closed and
// nothing runs.
func (p *Proxy) startServers(ctx context.Context, l net.Listener) (*servers, error) {
	l = p.limitConns(l) // limits.go
	s := &servers{gs: p.newGRPCServer(connlimit.GRPCMarks(l)), errc: make(chan error, 3), innerDone: make(chan struct{})}
	// The JSON gateway calls the proxy's own gRPC server in memory, so
	// HTTP clients get the same forwarding, fail-over and readonly rules.
	s.inner = bufconn.Listen(1 << 20)
	go func() { defer close(s.innerDone); _ = s.gs.Serve(s.inner) }()
	gconn, err := grpc.NewClient("passthrough:///proxy",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return s.inner.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)))
	if err != nil {
		s.gs.Stop()
		<-s.innerDone
		_ = l.Close()
		return nil, err
	}
	s.gconn = gconn
	gwmux, err := newGateway(ctx, gconn)
	if err != nil {
		_ = gconn.Close()
		s.gs.Stop()
		<-s.innerDone
		_ = l.Close()
		return nil, err
	}
	// Each gateway request is in flight on its connection while it runs
	// (limitConns): connlimit.Handler, here and with TLS below.
	s.hs = &http.Server{Handler: p.httpHandler(gwmux), ConnContext: connlimit.ConnContext}
	p.limitHTTP(s.hs) // limits.go
	if p.cfg.ServerTLS == nil {
		s.hs.Handler = connlimit.Handler(s.hs.Handler)
		s.split = newSplitListener(l, p.log, p.cfg.setting("proxy.Config.MaxConns"))
		go func() { s.errc <- s.gs.Serve(s.split.grpc) }()
		go func() { s.errc <- s.hs.Serve(s.split.web) }()
		go func() { s.errc <- s.split.serve() }()
		return s, nil
	}
	tlsCfg := p.cfg.ServerTLS.Clone()
	if len(tlsCfg.NextProtos) == 0 {
		tlsCfg.NextProtos = []string{"h2", "http/1.1"}
	}
	s.hs.TLSConfig = tlsCfg
	web := s.hs.Handler
	// A gRPC call over TLS is a request of the HTTP server's too.
	s.hs.Handler = connlimit.Handler(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
			s.gs.ServeHTTP(w, r)
			return
		}
		web.ServeHTTP(w, r)
	}))
	go func() { s.errc <- s.hs.ServeTLS(l, "", "") }()
	return s, nil
}

// stopGrace bounds each graceful step of servers.stop.
const stopGrace = time.Second

// stop shuts the servers down, in this order: the listener stops
// accepting; HTTP requests get stopGrace to finish (Shutdown), then every
// HTTP connection closes; gRPC calls get stopGrace (GracefulStop), then
// every stream ends (Stop: watch and keep-alive streams do not end by
// themselves); the in-memory gRPC server has returned; the gateway's
// connection closes. ctx cuts the graceful steps short.
func (s *servers) stop(ctx context.Context) {
	if s.split != nil {
		_ = s.split.close()
	}
	sctx, cancel := context.WithTimeout(ctx, stopGrace)
	_ = s.hs.Shutdown(sctx)
	cancel()
	_ = s.hs.Close()
	grpcstop.Stop(ctx, stopGrace, s.gs)
	<-s.innerDone
	_ = s.gconn.Close()
}

// wait waits for the listener split's goroutines (after stop).
func (s *servers) wait() {
	if s.split != nil {
		s.split.wg.Wait()
	}
}

// serve runs the proxy on l until ctx ends (see the lifecycle above).
func (p *Proxy) serve(ctx context.Context, l net.Listener) error {
	p.finding.mu.Lock()
	p.finding.since = time.Now()
	p.finding.mu.Unlock()
	srv, err := p.startServers(ctx, l)
	if err != nil {
		return err
	}
	p.log.Info("proxy listening; finding the etcd cluster", "addr", l.Addr().String(), "mode", p.cfg.Mode)
	refreshDone := make(chan struct{})
	startErr, serveErr := p.findAndServe(ctx, l, srv.errc, refreshDone)
	srv.stop(context.Background())
	if p.started.Load() {
		p.watch.close()
		p.lease.close()
		<-refreshDone
	} else if p.watch != nil {
		p.watch.close() // begin failed after the hub started
	}
	srv.wait()
	if startErr != nil && ctx.Err() == nil {
		return startErr
	}
	if serveErr != nil && !errors.Is(serveErr, net.ErrClosed) && !errors.Is(serveErr, http.ErrServerClosed) &&
		!errors.Is(serveErr, grpc.ErrServerStopped) && ctx.Err() == nil {
		return serveErr
	}
	return nil
}

// findAndServe finds the cluster while the servers answer, begins
// forwarding (the refresh loop closes refreshDone when it ends), and
// serves until ctx ends or a server fails (errc). It returns once the
// search has stopped: the error that ended the search, and the server's.
func (p *Proxy) findAndServe(ctx context.Context, l net.Listener, errc <-chan error, refreshDone chan<- struct{}) (startErr, serveErr error) {
	findCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	startc := make(chan error, 1)
	go func() { startc <- p.start(findCtx) }()
	select {
	case <-ctx.Done():
	case serveErr = <-errc:
	case startErr = <-startc:
		startc = nil
		if startErr == nil {
			startErr = p.begin()
		}
		if startErr == nil {
			go func() { defer close(refreshDone); p.refreshLoop(ctx) }()
			p.started.Store(true)
			close(p.ready)
			p.log.Info("proxy serving", "addr", l.Addr().String(), "mode", p.cfg.Mode)
			select {
			case <-ctx.Done():
			case serveErr = <-errc:
			}
		}
	}
	if startc != nil {
		stopStart()
		// Connected or not, Serve closes what it opened.
		if err := <-startc; err != nil {
			p.log.Debug("stopped finding the cluster", "err", err)
		}
	}
	return startErr, serveErr
}
