package proxy

import (
	"log/slog"
	"net/http"
	"time"

	"github.com/beaconplane/beacon/internal/pprofhttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
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
	// DefaultMaxStreams bounds the client streams open at once
	// (Config.MaxStreams).
	DefaultMaxStreams = 10_000
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
// keeps the client_streams gauge.
func (p *Proxy) limitStreams(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	n := p.streams.Add(1)
	defer func() {
		p.streams.Add(-1)
		p.m.clientStreams.Dec()
	}()
	p.m.clientStreams.Inc()
	if limit := p.cfg.MaxStreams; limit > 0 && n > int64(limit) {
		err := status.Errorf(codes.ResourceExhausted,
			"proxy: %d client streams are open on this proxy, the most it serves (--max-streams): close watch and keep-alive streams you no longer need (an etcd client needs one of each), or raise the limit", limit)
		p.refuseStream(ss, info, err)
		return err
	}
	return handler(srv, ss)
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
// connections, body size, and per-request deadlines on every route that
// does not stream.
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
		if r.Body != nil {
			r.Body = http.MaxBytesReader(w, r.Body, limit)
		}
		rc := http.NewResponseController(w)
		now := time.Now()
		switch hold := p.profileHold(r); {
		case streamingPaths[r.URL.Path]:
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
