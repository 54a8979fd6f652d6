package proxy

import (
	"context"
	"strings"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

// The proxy never lends its identity. A request reaches etcd over the
// proxy's own connection; when it carries no token and etcd runs with
// --client-cert-auth, etcd takes the common name of the proxy's client
// certificate as the user (etcd's AuthInfoFromTLS), so a client without
// credentials would act as that user — root, if the certificate was issued
// for it. So while the cluster has authentication enabled and the proxy
// presents a client certificate, a request without a token is refused
// with etcd's own answer to an anonymous request (user name is empty,
// which etcd clients answer by authenticating), except the calls etcd
// serves to anyone: Authenticate (how a client gets its token),
// AuthStatus, MemberList, Status, and lease keep-alives (which etcd does
// not authorize).

// The refusal rests on the cluster's authentication status, asked at most
// once per authStatusTTL, so it lags an `etcdctl auth enable` by up to that
// long. What closes the gap is anonymousToken: a request without
// credentials that the proxy forwards over a certificate-bearing
// connection carries it as its token. etcd ignores tokens while
// authentication is off, and refuses a token it did not issue while it is
// on ("invalid auth token") instead of falling back to the certificate's
// common name; a request proposed before the switch and applied after it
// has no user name and is refused at apply. So no request ever acts as
// the proxy's certificate, whatever the timing.

// anonymousToken is the token of requests without credentials forwarded
// over a connection that presents a client certificate; no etcd token
// provider issues it (simple tokens are random letters, a dot and an
// index; JWTs have three parts).
const anonymousToken = "beacon-proxy-no-credentials"

// anonymousFree are the etcd calls that need no user.
var anonymousFree = map[string]bool{
	authSvc + "Authenticate":       true,
	authSvc + "AuthStatus":         true,
	clusSvc + "MemberList":         true,
	mainSvc + "Status":             true,
	leaseSvc + "LeaseKeepAlive":    true,
	"/grpc.health.v1.Health/Check": true,
	"/grpc.health.v1.Health/Watch": true,
}

// authStatusTTL is how long the cluster's authentication status is
// trusted before it is asked again.
const authStatusTTL = time.Second

// anonGuard caches whether the cluster has authentication enabled.
type anonGuard struct {
	mu      sync.Mutex
	checked time.Time
	on      bool
}

// hasClientCert reports whether the proxy presents a client certificate
// to the members (an identity etcd may take for the user).
func (p *Proxy) hasClientCert() bool {
	c := p.cfg.ClientTLS
	return c != nil && (len(c.Certificates) > 0 || c.GetClientCertificate != nil)
}

// hasToken reports whether the request carries credentials for etcd.
func hasToken(ctx context.Context) bool {
	md, _ := metadata.FromIncomingContext(ctx)
	for _, k := range []string{rpctypes.TokenFieldNameGRPC, "authorization"} {
		for _, v := range md.Get(k) {
			if strings.TrimSpace(v) != "" {
				return true
			}
		}
	}
	return false
}

// lendsIdentity reports whether forwarding the request as it is could
// make etcd take the proxy's client certificate for its user: an etcd
// call that needs a user, without credentials, over a connection with a
// client certificate.
func (p *Proxy) lendsIdentity(ctx context.Context, method string) bool {
	if !p.hasClientCert() || anonymousFree[method] || hasToken(ctx) {
		return false
	}
	// Others are served by the proxy itself, or refused as unknown.
	return strings.HasPrefix(method, "/etcdserverpb.") || strings.HasPrefix(method, "/v3electionpb.") || strings.HasPrefix(method, "/v3lockpb.")
}

// refuseAnonymous returns the error for a request that would act as the
// proxy's certificate, or nil.
func (p *Proxy) refuseAnonymous(ctx context.Context, method string) error {
	if !p.lendsIdentity(ctx, method) {
		return nil
	}
	on, err := p.authEnabled(ctx)
	if err != nil {
		return status.Errorf(codes.Unavailable, "proxy: cannot tell whether the cluster requires authentication, so a request without credentials is not forwarded: %v", err)
	}
	if !on {
		return nil
	}
	return rpctypes.ErrGRPCUserEmpty
}

// authEnabled asks the cluster (at most once per authStatusTTL) whether
// authentication is enabled.
func (p *Proxy) authEnabled(ctx context.Context) (bool, error) {
	g := &p.anon
	g.mu.Lock()
	defer g.mu.Unlock()
	if time.Since(g.checked) < authStatusTTL {
		return g.on, nil
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), p.cfg.DialTimeout+time.Second)
	defer cancel()
	resp, err := p.client.AuthStatus(ctx)
	if err != nil {
		return false, err
	}
	g.on, g.checked = resp.Enabled, time.Now()
	return g.on, nil
}

// anonymousError turns etcd's refusal of anonymousToken into its answer
// to a request without credentials (what a client expects, and answers by
// authenticating), and makes the next request ask the cluster again.
func (p *Proxy) anonymousError(ctx context.Context, method string, err error) error {
	if err == nil || !p.lendsIdentity(ctx, method) || status.Convert(err).Message() != rpctypes.ErrorDesc(rpctypes.ErrGRPCInvalidAuthToken) {
		return err
	}
	p.anon.mu.Lock()
	p.anon.checked = time.Time{}
	p.anon.mu.Unlock()
	return rpctypes.ErrGRPCUserEmpty
}

// anonymousStream refuses streams (watches, unknown methods) that would act
// as the proxy's certificate.
func (p *Proxy) anonymousStream(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, handler grpc.StreamHandler) error {
	if err := p.refuseAnonymous(ss.Context(), info.FullMethod); err != nil {
		return err
	}
	return handler(srv, ss)
}
