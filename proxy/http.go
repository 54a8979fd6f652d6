package proxy

import (
	"context"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
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
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
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
