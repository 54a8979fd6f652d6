package server

import (
	"context"
	"crypto/x509"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/connlimit"
	"github.com/beaconplane/beacon/internal/hostport"
	"github.com/beaconplane/beacon/internal/tlsfiles"
	"github.com/beaconplane/beacon/server/xdsapi"
	"github.com/beaconplane/beacon/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	grpccreds "google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// XDSConfig configures the xDS interface of the server (docs/xds.md).
type XDSConfig struct {
	// Addr is where xDS (gRPC, ADS) is served (host:port). Empty disables
	// it; `beacon serve` defaults to xdsapi.DefaultAddr (127.0.0.1:9380).
	Addr string
	// MaxStreams bounds the ADS streams open at once;
	// xdsapi.DefaultMaxStreams when zero.
	MaxStreams int
	// MaxStreamsPerClient bounds those of one client address;
	// xdsapi.DefaultMaxStreamsPerClient when zero, no bound when negative.
	MaxStreamsPerClient int
	// MaxNamesPerClient bounds the resource names the streams of one
	// client address subscribe to together;
	// xdsapi.DefaultMaxNamesPerClient when zero, no bound when negative.
	MaxNamesPerClient int
}

func (c XDSConfig) validate() []error {
	if c.Addr == "" {
		return nil
	}
	var errs []error
	if err := hostport.Check(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("Config.XDS.Addr %q: %w, e.g. %s (or empty to disable xDS)", c.Addr, err, xdsapi.DefaultAddr))
	}
	if c.MaxStreams < 0 {
		errs = append(errs, fmt.Errorf("Config.XDS.MaxStreams %d: must be positive (0 for the default, %d)", c.MaxStreams, xdsapi.DefaultMaxStreams))
	}
	return errs
}

// xdsState is the server's xDS interface.
type xdsState struct {
	ln   net.Listener
	addr string
	srv  *xdsapi.Server
	tls  *tlsfiles.Reloader
}

// listenXDS takes the xDS port early, so that a port in use fails before
// etcd writes anything.
func (s *Server) listenXDS() error {
	c := s.cfg.XDS
	if c.Addr == "" {
		return nil
	}
	ln, err := listen(c.Addr, "Config.XDS.Addr")
	if err != nil {
		return err
	}
	perClient := c.MaxStreamsPerClient
	if perClient == 0 {
		perClient = xdsapi.DefaultMaxStreamsPerClient
	}
	s.xds.addr = ln.Addr().String()
	// The gRPC server marks each stream on its connection (GRPCMarks in
	// startXDS): a bound reached closes a connection that never carried a
	// stream (a flood of idle ones), else one whose streams all ended,
	// never one with a stream open, and refuses a newcomer only when every
	// connection of its address streams.
	s.xds.ln = connlimit.Listener(ln, connlimit.Config{Max: s.sec.MaxConns, PerAddr: perClient, Marked: true,
		Log: s.log.With("component", "xds"), What: "xDS"})
	return nil
}

// startXDS serves xDS from the registry behind the HTTP API.
func (s *Server) startXDS() error {
	if s.xds.ln == nil {
		return nil
	}
	cfg := xdsapi.Config{
		MaxStreams:          s.cfg.XDS.MaxStreams,
		MaxStreamsPerClient: s.cfg.XDS.MaxStreamsPerClient,
		MaxNamesPerClient:   s.cfg.XDS.MaxNamesPerClient,
		Authorize:           s.authorizeXDS,
		Logger:              s.log,
		Metrics:             s.reg,
		SettingName:         s.cfg.SettingName,
		ServerOptions:       []grpc.ServerOption{grpc.StatsHandler(connlimit.GRPCMarks(s.xds.ln))},
	}
	if f := s.sec.XDSTLS; f.CertFile != "" {
		r, err := tlsfiles.NewReloader(f, tlsfiles.Config{Logger: s.log.With("component", "xds-tls"), Listener: "xds",
			Names: tlsfiles.ListenerNames(s.cfg.XDS.Addr), Metrics: s.reg})
		if err != nil {
			return err
		}
		s.xds.tls = r
		cfg.ServerOptions = append(cfg.ServerOptions, grpc.Creds(grpccreds.NewTLS(r.ServerConfig("h2"))))
	}
	srv, err := xdsapi.New(s.data.registry, cfg)
	if err != nil {
		return fmt.Errorf("xds: %w", err)
	}
	s.xds.srv = srv
	ln := s.xds.ln
	s.xds.ln = nil // owned by srv now
	s.life.wg.Add(1)
	go func() {
		defer s.life.wg.Done()
		if err := srv.Serve(ln); err != nil {
			s.fail(fmt.Errorf("xds: %w", err))
		}
	}()
	return nil
}

// xdsReadiness adds the xDS interface's state to a readiness report. A
// registry watch cut off from its store is reported, not failed: clients
// keep the last state, and the store's own check fails readiness.
func (s *Server) xdsReadiness(res *readiness) {
	srv := s.xds.srv
	if srv == nil {
		return
	}
	switch since, err := srv.Stale(); {
	case !srv.Ready():
		res.Checks["xds"] = "waiting for the registry's first snapshot (streams are answered once it is in)"
		res.Status = "unavailable"
	case !since.IsZero():
		res.Checks["xds"] = fmt.Sprintf("serving the last state: the registry watch lost its store %v ago (%v); clients keep what they have",
			time.Since(since).Round(time.Second), err)
	default:
		res.Checks["xds"] = "ok"
	}
}

// closeXDS stops the xDS interface (or releases its port if it never
// started).
func (s *Server) closeXDS() {
	if s.xds.srv != nil {
		_ = s.xds.srv.Close()
	}
	if s.xds.ln != nil {
		_ = s.xds.ln.Close()
	}
}

// XDS returns the xDS interface (nil when disabled or before Start).
func (s *Server) XDS() *xdsapi.Server { return s.xds.srv }

// XDSAddr returns the address xDS is served on (empty when disabled or
// before Start).
func (s *Server) XDSAddr() string { return s.xds.addr }

// authorizeXDS decides what the client of an ADS stream may read: with
// etcd authentication on, the namespaces its etcd user may read, as the
// HTTP API authenticates it (Basic or Bearer credentials in the
// authorization metadata, or a verified client certificate's common
// name); without, everything.
func (s *Server) authorizeXDS(ctx context.Context) (xdsapi.Access, error) {
	st := s.authn()
	if st.auth == nil {
		return nil, nil
	}
	on, err := st.auth.enabled(ctx)
	if err != nil {
		return nil, status.Errorf(codes.Unavailable, "cannot tell whether etcd authentication is on: %v", err)
	}
	if !on {
		return nil, nil
	}
	id, ok, err := grpcCredentials(ctx)
	switch {
	case err != nil:
		return nil, status.Error(codes.Unauthenticated, err.Error())
	case !ok:
		return nil, status.Error(codes.Unauthenticated, errNoCredentials.Error()+
			": send the etcd user's credentials in the authorization metadata (Basic base64(user:password), or Bearer and an etcd token), or a client certificate whose common name is the user ("+s.cfg.setting("Config.Security.XDSTLS.TrustedCAFile")+")")
	}
	uv, fail := st.checkIdentity(ctx, grpcPeerHost(ctx), id)
	if fail != nil {
		return nil, fail.grpcStatus()
	}
	return &xdsAccess{s: s, uv: uv}, nil
}

// grpcStatus is the failure as a gRPC status.
func (f *authFailure) grpcStatus() error {
	code := codes.Unavailable
	switch f.code {
	case http.StatusUnauthorized:
		code = codes.Unauthenticated
	case http.StatusTooManyRequests:
		code = codes.ResourceExhausted
	}
	return status.Error(code, f.msg)
}

// xdsAccess is what one authenticated xDS client may read: what its etcd
// user may read, as etcd answers a permission probe made as that user.
type xdsAccess struct {
	s  *Server
	uv *userView
}

func (a *xdsAccess) Readable(ctx context.Context, ns string) (bool, error) {
	prefix := a.uv.reg.ReadPrefix(beacon.Query{Namespace: ns})
	err := probe(ctx, a.uv.cli, prefix, false)
	switch {
	case err == nil:
		return true, nil
	case errors.Is(err, store.ErrPermissionDenied):
		return false, nil
	case errors.Is(err, store.ErrUnauthenticated):
		return false, status.Errorf(codes.Unauthenticated, "etcd no longer accepts the credentials of %q: %v", a.uv.id.user, err)
	}
	return false, err
}

func (a *xdsAccess) Release() { a.s.authn().views.release(a.uv) }

// grpcCredentials reads an ADS stream's identity: the authorization
// metadata, else a verified client certificate's common name.
func grpcCredentials(ctx context.Context) (identity, bool, error) {
	var header string
	if md, ok := metadata.FromIncomingContext(ctx); ok {
		switch v := md.Get("authorization"); len(v) {
		case 0:
		case 1:
			header = v[0]
		default:
			return identity{}, false, errors.New("more than one authorization metadata entry: send one")
		}
	}
	var verified [][]*x509.Certificate
	if p, ok := peer.FromContext(ctx); ok {
		if ti, ok := p.AuthInfo.(grpccreds.TLSInfo); ok {
			verified = ti.State.VerifiedChains
		}
	}
	return credentialsFrom(header, verified)
}

// grpcPeerHost is the client's address without its port.
func grpcPeerHost(ctx context.Context) string {
	if p, ok := peer.FromContext(ctx); ok && p.Addr != nil {
		if host, _, err := net.SplitHostPort(p.Addr.String()); err == nil {
			return host
		}
	}
	return "unknown"
}
