package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/http"
	"strings"
	"time"

	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/internal/pprofhttp"
	gw "github.com/grpc-ecosystem/grpc-gateway/v2/runtime"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/tmc/grpc-websocket-proxy/wsproxy"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	etcdgw "go.etcd.io/etcd/api/v3/etcdserverpb/gw"
	electiongw "go.etcd.io/etcd/server/v3/etcdserver/api/v3election/v3electionpb/gw"
	lockgw "go.etcd.io/etcd/server/v3/etcdserver/api/v3lock/v3lockpb/gw"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
	"google.golang.org/grpc/test/bufconn"
	"google.golang.org/protobuf/encoding/protojson"
)

// HTTP routes served beside the gRPC API on the same listener.
const (
	PathGateway   = "/v3/"
	PathMetrics   = "/metrics"
	PathHealth    = "/health"
	PathEndpoints = "/proxy/endpoints"
	// PathV2 is etcd's v2 API (/v2/keys, /v2/members, ...), which the
	// proxy does not forward: it answers why (V2NotProxied).
	PathV2 = "/v2/"
)

// V2NotProxied is the message of every request to the etcd v2 API.
const V2NotProxied = "the etcd v2 API (/v2/keys, /v2/members, ...) is not proxied: beacon proxy forwards etcd's v3 API " +
	"(gRPC, and the JSON gateway under /v3/). etcd 3.4 turned its v2 API off by default, 3.6 removed the v2 proxy " +
	"(etcd --proxy) and 3.7 serves no v2 API at all, so a cluster could not answer it; use the v3 API " +
	"(etcdctl, clientv3, or POST /v3/kv/range ...). etcd 2's proxy flags map to beacon proxy's: docs/proxy.md"

// serve runs the gRPC and HTTP servers on l until ctx ends. They answer
// at once; requests get notReady until start has found the cluster.
func (p *Proxy) serve(ctx context.Context, l net.Listener) error {
	p.finding.mu.Lock()
	p.finding.since = time.Now()
	p.finding.mu.Unlock()
	gs := p.newGRPCServer()

	// The JSON gateway calls the proxy's own gRPC server in memory, so
	// HTTP clients get the same forwarding, fail-over and readonly rules.
	inner := bufconn.Listen(1 << 20)
	innerDone := make(chan struct{})
	go func() { defer close(innerDone); _ = gs.Serve(inner) }()
	gconn, err := grpc.NewClient("passthrough:///proxy",
		grpc.WithContextDialer(func(ctx context.Context, _ string) (net.Conn, error) { return inner.DialContext(ctx) }),
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithDefaultCallOptions(grpc.MaxCallRecvMsgSize(maxMsgSize), grpc.MaxCallSendMsgSize(maxMsgSize)))
	if err != nil {
		gs.Stop()
		<-innerDone
		_ = l.Close()
		return err
	}
	gwmux, err := newGateway(ctx, gconn)
	if err != nil {
		_ = gconn.Close()
		gs.Stop()
		<-innerDone
		_ = l.Close()
		return err
	}
	hs := &http.Server{Handler: p.httpHandler(gwmux)}
	p.limitHTTP(hs) // limits.go

	errc := make(chan error, 3)
	var split *splitListener
	if p.cfg.ServerTLS != nil {
		tlsCfg := p.cfg.ServerTLS.Clone()
		if len(tlsCfg.NextProtos) == 0 {
			tlsCfg.NextProtos = []string{"h2", "http/1.1"}
		}
		hs.TLSConfig = tlsCfg
		web := hs.Handler
		hs.Handler = http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.ProtoMajor == 2 && strings.HasPrefix(r.Header.Get("Content-Type"), "application/grpc") {
				gs.ServeHTTP(w, r)
				return
			}
			web.ServeHTTP(w, r)
		})
		go func() { errc <- hs.ServeTLS(l, "", "") }()
	} else {
		split = newSplitListener(l)
		go func() { errc <- gs.Serve(split.grpc) }()
		go func() { errc <- hs.Serve(split.web) }()
		go func() { errc <- split.serve() }()
	}
	p.log.Info("proxy listening; finding the etcd cluster", "addr", l.Addr().String(), "mode", p.cfg.Mode)

	// Find the cluster while answering; serving can end first (Close, or
	// the listener failing), which stops the search.
	findCtx, stopStart := context.WithCancel(ctx)
	defer stopStart()
	startc := make(chan error, 1)
	go func() { startc <- p.start(findCtx) }()
	var serveErr, startErr error
	refreshDone := make(chan struct{})
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

	// Shut down: stop accepting, let unary calls finish briefly, then end
	// every stream.
	if split != nil {
		_ = split.close()
	}
	sctx, cancel := context.WithTimeout(context.Background(), time.Second)
	_ = hs.Shutdown(sctx)
	cancel()
	_ = hs.Close()
	stopped := make(chan struct{})
	go func() { gs.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
	case <-time.After(time.Second):
		gs.Stop()
		<-stopped
	}
	<-innerDone
	_ = gconn.Close()
	if p.started.Load() {
		p.watch.close()
		p.lease.close()
		<-refreshDone
	} else if p.watch != nil {
		p.watch.close() // begin failed after the hub started
	}
	if split != nil {
		split.wg.Wait()
	}
	if startErr != nil && ctx.Err() == nil {
		return startErr
	}
	if serveErr != nil && !errors.Is(serveErr, net.ErrClosed) && !errors.Is(serveErr, http.ErrServerClosed) &&
		!errors.Is(serveErr, grpc.ErrServerStopped) && ctx.Err() == nil {
		return serveErr
	}
	return nil
}

// begin sets up what forwarding needs once start has connected: the
// upstream watches' member, the keep-alive multiplexer.
func (p *Proxy) begin() error {
	p.watch = newWatchHub(p)
	if err := p.watch.startMember(); err != nil {
		return err
	}
	p.hubRef.Store(p.watch)
	p.lease = newLeaseMux(p)
	return nil
}

// newGateway registers etcd's JSON gateway (the /v3/... paths) over conn,
// with the same marshalling as an etcd member.
func newGateway(ctx context.Context, conn *grpc.ClientConn) (*gw.ServeMux, error) {
	mux := gw.NewServeMux(
		// The gateway's calls come over an in-memory connection: the HTTP
		// client's address travels with them, for the per-client bounds.
		gw.WithMetadata(func(_ context.Context, r *http.Request) metadata.MD {
			host, _, err := net.SplitHostPort(r.RemoteAddr)
			if err != nil {
				host = r.RemoteAddr
			}
			return metadata.Pairs(gatewayClientKey, host)
		}),
		gw.WithMarshalerOption(gw.MIMEWildcard, &gw.HTTPBodyMarshaler{
			Marshaler: &gw.JSONPb{
				MarshalOptions:   protojson.MarshalOptions{UseProtoNames: true, EmitUnpopulated: false},
				UnmarshalOptions: protojson.UnmarshalOptions{DiscardUnknown: true},
			},
		}),
	)
	for _, reg := range []func(context.Context, *gw.ServeMux, *grpc.ClientConn) error{
		etcdgw.RegisterKVHandler, etcdgw.RegisterWatchHandler, etcdgw.RegisterLeaseHandler,
		etcdgw.RegisterClusterHandler, etcdgw.RegisterMaintenanceHandler, etcdgw.RegisterAuthHandler,
		lockgw.RegisterLockHandler, electiongw.RegisterElectionHandler,
	} {
		if err := reg(ctx, mux, conn); err != nil {
			return nil, err
		}
	}
	return mux, nil
}

func (p *Proxy) httpHandler(gwmux *gw.ServeMux) http.Handler {
	mux := http.NewServeMux()
	mux.Handle(PathGateway, wsproxy.WebsocketProxy(gwmux,
		wsproxy.WithRequestMutator(func(_ *http.Request, out *http.Request) *http.Request {
			out.Method = http.MethodPost
			return out
		}),
		wsproxy.WithMaxRespBodyBufferSize(0x7fffffff),
	))
	mux.Handle(PathMetrics, promhttp.HandlerFor(p.reg, promhttp.HandlerOpts{}))
	mux.HandleFunc(PathHealth, p.handleHealth)
	if p.cfg.EnablePprof {
		pprofhttp.Mount(mux)
	}
	mux.HandleFunc(PathEndpoints, func(w http.ResponseWriter, r *http.Request) {
		if err := p.notReady(); err != nil {
			// The endpoints the last attempt to find the cluster tried.
			writeJSON(w, http.StatusOK, map[string]any{"mode": p.cfg.Mode, "ready": false,
				"reason": status.Convert(err).Message(), "endpoints": p.Endpoints()})
			return
		}
		writeJSON(w, http.StatusOK, map[string]any{"mode": p.cfg.Mode, "ready": true, "endpoints": p.dir.status()})
	})
	mux.HandleFunc(PathV2, func(w http.ResponseWriter, r *http.Request) {
		// etcd v2's error shape, so that v2 clients show the message.
		writeJSON(w, http.StatusNotImplemented, map[string]any{"errorCode": 0, "message": V2NotProxied, "cause": r.URL.Path})
	})
	mux.HandleFunc("/", func(w http.ResponseWriter, r *http.Request) {
		// Not a plain-text "404 page not found": say what is served.
		writeJSON(w, http.StatusNotFound, map[string]any{"code": int(codes.NotFound), "message": "proxy: no such path " +
			r.URL.Path + ": this listener serves etcd's v3 gRPC API, the JSON gateway under " + PathGateway + ", " +
			PathHealth + ", " + PathMetrics + " and " + PathEndpoints})
	})
	// A repeated Authorization (the gateway's etcd token) would reach etcd
	// as two tokens, of which it reads one: refuse it, in the gateway's
	// error shape.
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if name, n := httpapi.RepeatedHeader(r, "Authorization", "Content-Type"); name != "" {
			writeJSON(w, http.StatusBadRequest, map[string]any{"code": int(codes.InvalidArgument),
				"message": fmt.Sprintf("proxy: the %s header is given %d times: send it once", name, n)})
			return
		}
		mux.ServeHTTP(w, r)
	})
}

// Health is the body of GET /health.
type Health struct {
	Health string `json:"health"`
	Reason string `json:"reason,omitempty"`
}

// CheckHealth reads through the proxy's forwarding path (a linearizable
// one-key range, 1 s deadline, like etcd's grpc-proxy); an authentication
// or permission error still proves the cluster answers.
func (p *Proxy) CheckHealth(ctx context.Context) error {
	if err := p.notReady(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	ctx = metadata.NewOutgoingContext(ctx, metadata.Pairs(viaKey, p.id))
	_, _, err := p.invoke(ctx, kvSvc+"Range", &pb.RangeRequest{Key: []byte("health"), CountOnly: true, Limit: 1},
		new(pb.RangeResponse), false, true)
	switch status.Code(err) {
	case codes.OK:
		return nil
	case codes.Unavailable, codes.DeadlineExceeded, codes.Canceled, codes.Unknown, codes.Internal, codes.FailedPrecondition:
		return err
	}
	// etcd answered (for example "user name is empty" or "permission
	// denied" with authentication on): the cluster is up.
	return nil
}

func (p *Proxy) handleHealth(w http.ResponseWriter, r *http.Request) {
	if err := p.CheckHealth(r.Context()); err != nil {
		writeJSON(w, http.StatusServiceUnavailable, Health{Health: "false", Reason: status.Convert(err).Message()})
		return
	}
	writeJSON(w, http.StatusOK, Health{Health: "true"})
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}
