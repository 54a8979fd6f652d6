package server

import (
	"context"
	"crypto/sha256"
	"crypto/x509"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon/internal/setting"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/auth"
	"go.etcd.io/etcd/server/v3/etcdserver"
)

// How a request authenticated.
const (
	methodBasic  = "basic"
	methodBearer = "bearer"
	methodCert   = "certificate"
)

// errNoCredentials reports a request without credentials to a server that
// requires them.
var errNoCredentials = errors.New("authentication required: this server's etcd has authentication enabled")

// identity is who a request says it is.
type identity struct {
	method   string
	user     string // "" for a bearer token whose user is not known yet
	password string // basic
	token    string // bearer
}

// key identifies the identity in the cache of user views. Passwords and
// tokens enter it hashed with a per-process salt, so that a wrong password
// never matches a cached view.
func (id identity) key(salt []byte) string {
	sum := saltedSum(salt, id.method+"\x00"+id.user+"\x00"+id.password+"\x00"+id.token)
	return hex.EncodeToString(sum[:])
}

// saltedSum is the SHA-256 of salt followed by s: what the server keeps of
// a secret or of a client-chosen name, so that neither is kept in clear nor
// makes a table's keys large.
func saltedSum(salt []byte, s string) [sha256.Size]byte {
	h := sha256.New()
	h.Write(salt)
	h.Write([]byte(s))
	var sum [sha256.Size]byte
	h.Sum(sum[:0])
	return sum
}

// throttleName is what failures of id count under, with the client's
// address: its user name; for a bearer token, the token itself (its user,
// read from a JWT before the signature is checked, could be anyone's, so
// forged tokens naming a user must not throttle that user's real ones).
func (id identity) throttleName() string {
	if id.method == methodBearer {
		h := sha256.Sum256([]byte(id.token))
		return "token " + hex.EncodeToString(h[:8])
	}
	return id.user
}

// credentials reads the request's identity: an Authorization header
// (Basic user:password, or Bearer <etcd token>), else the common name of a
// verified client certificate, as etcd does on its client port.
func credentials(r *http.Request) (identity, bool, error) {
	var verified [][]*x509.Certificate
	if r.TLS != nil {
		verified = r.TLS.VerifiedChains
	}
	return credentialsFrom(r.Header.Get("Authorization"), verified)
}

// credentialsFrom reads an identity from an Authorization header's value
// (Basic user:password, or Bearer <etcd token>), else from the common name
// of a verified client certificate, as etcd does on its client port. The
// HTTP API and xDS (the authorization metadata) read it alike.
func credentialsFrom(h string, verified [][]*x509.Certificate) (identity, bool, error) {
	if h != "" {
		// The scheme ends at the first space or tab (RFC 9110 allows
		// only spaces; a tab must not make the credentials part of the
		// scheme, which an error message quotes).
		scheme, rest := h, ""
		if i := strings.IndexAny(h, " \t"); i >= 0 {
			scheme, rest = h[:i], h[i+1:]
		}
		rest = strings.TrimSpace(rest)
		switch strings.ToLower(scheme) {
		case "basic":
			raw, err := base64.StdEncoding.DecodeString(rest)
			if err != nil {
				return identity{}, false, errors.New("malformed Basic credentials: send Authorization: Basic base64(user:password)")
			}
			user, pw, ok := strings.Cut(string(raw), ":")
			if !ok || user == "" || !utf8.ValidString(user) {
				return identity{}, false, errors.New("malformed Basic credentials: send Authorization: Basic base64(user:password) with a non-empty user name")
			}
			return identity{method: methodBasic, user: user, password: pw}, true, nil
		case "bearer":
			if rest == "" || strings.ContainsAny(rest, " \t") {
				return identity{}, false, errors.New("malformed Bearer credentials: send Authorization: Bearer <etcd token> (from POST /v1/auth/token)")
			}
			return identity{method: methodBearer, token: rest, user: jwtUser(rest)}, true, nil
		default:
			if len(scheme) > 32 {
				scheme = scheme[:32] + "…"
			}
			return identity{}, false, fmt.Errorf("authorization scheme %q is not supported: use Basic (user:password) or Bearer (an etcd token)", scheme)
		}
	}
	if len(verified) > 0 && len(verified[0]) > 0 {
		cn := verified[0][0].Subject.CommonName
		if cn == "" {
			return identity{}, false, errors.New("the client certificate has no common name, so it names no etcd user: issue it with CN=<etcd user>, or send Basic or Bearer credentials")
		}
		return identity{method: methodCert, user: cn}, true, nil
	}
	return identity{}, false, nil
}

// authority authenticates identities against etcd and opens clients that
// act as them.
type authority interface {
	// enabled reports whether etcd authentication is on.
	enabled(ctx context.Context) (bool, error)
	// revision is etcd's auth revision, which every change of users,
	// passwords, roles or permissions raises: a view opened at an older
	// one is checked again (a changed password must stop the old one).
	revision(ctx context.Context) (uint64, error)
	// open authenticates id and returns a store whose client acts as it,
	// and id with its user name filled in. Bad credentials give an error
	// matching store.ErrUnauthenticated. Closing the store releases the
	// client.
	open(ctx context.Context, id identity) (*etcdstore.Store, identity, error)
	// token returns an etcd token for a user and password.
	token(ctx context.Context, user, password string) (string, error)
}

// unauthenticated wraps an etcd refusal of credentials.
func unauthenticated(format string, args ...any) error {
	return fmt.Errorf("%w: "+format, append([]any{store.ErrUnauthenticated}, args...)...)
}

// explainAuthError turns etcd's authentication errors into messages that
// say what to fix.
func explainAuthError(id identity, err error) error {
	e := rpctypes.Error(err)
	switch {
	case errors.Is(err, auth.ErrAuthFailed):
		e = rpctypes.ErrAuthFailed
	case errors.Is(err, auth.ErrInvalidAuthToken):
		e = rpctypes.ErrInvalidAuthToken
	case errors.Is(err, auth.ErrAuthOldRevision):
		e = rpctypes.ErrAuthOldRevision
	case errors.Is(err, auth.ErrUserEmpty):
		e = rpctypes.ErrUserEmpty
	}
	switch {
	case errors.Is(e, rpctypes.ErrAuthFailed):
		return unauthenticated("etcd refused user %q: wrong user name or password", id.user)
	case errors.Is(e, rpctypes.ErrInvalidAuthToken):
		return unauthenticated("etcd refused the token: it expired, was issued by another cluster or member (JWT keys differ), or is not a token: authenticate again (POST /v1/auth/token)")
	case errors.Is(e, rpctypes.ErrAuthOldRevision):
		return unauthenticated("the token predates a change of users or roles: authenticate again")
	case errors.Is(e, rpctypes.ErrUserEmpty):
		return unauthenticated("etcd did not accept the credentials as a user")
	case errors.Is(err, store.ErrUnauthenticated):
		return err
	}
	return err
}

// embeddedAuthority serves identities from the embedded etcd member,
// in-process.
type embeddedAuthority struct {
	srv     *etcdserver.EtcdServer
	minter  *jwtMinter
	log     *slog.Logger
	setting setting.Namer // names the settings its answers suggest
}

func (a *embeddedAuthority) enabled(context.Context) (bool, error) {
	return a.srv.AuthStore().IsAuthEnabled(), nil
}

func (a *embeddedAuthority) revision(context.Context) (uint64, error) {
	return a.srv.AuthStore().Revision(), nil
}

func (a *embeddedAuthority) token(ctx context.Context, user, password string) (string, error) {
	resp, err := a.srv.Authenticate(ctx, &pb.AuthenticateRequest{Name: user, Password: password})
	if err != nil {
		return "", explainAuthError(identity{method: methodBasic, user: user}, err)
	}
	return resp.Token, nil
}

// passwordSource fetches tokens by authenticating with a password.
func (a *embeddedAuthority) passwordSource(user, password string) *tokenSource {
	return &tokenSource{fetch: func(ctx context.Context) (string, error) {
		if !a.srv.AuthStore().IsAuthEnabled() {
			return "", nil
		}
		if user == "" {
			return "", unauthenticated("etcd authentication is enabled but this server has no credentials: give %s (or %s)", a.setting.Names("Config.Backend.Etcd.Username", "Config.Backend.Etcd.Password"), a.setting.Name("Config.Security.RootPasswordFile"))
		}
		return a.token(ctx, user, password)
	}}
}

// ownedStore is a store that closes its in-process client with it.
func ownedStore(cli *clientv3.Client) *etcdstore.Store {
	return etcdstore.NewFromClient(cli, etcdstore.CloseClient())
}

func (a *embeddedAuthority) open(ctx context.Context, id identity) (*etcdstore.Store, identity, error) {
	lg := zapFor(a.log)
	switch id.method {
	case methodBasic:
		src := a.passwordSource(id.user, id.password)
		if _, err := src.token(ctx); err != nil {
			return nil, id, err
		}
		return ownedStore(userClient(a.srv, src, lg)), id, nil
	case methodBearer:
		info, err := a.srv.AuthStore().AuthInfoFromCtx(withToken(ctx, id.token))
		if err != nil || info == nil {
			if err == nil {
				err = rpctypes.ErrInvalidAuthToken
			}
			return nil, id, explainAuthError(id, err)
		}
		id.user = info.Username
		return ownedStore(userClient(a.srv, fixedToken(id.token), lg)), id, nil
	case methodCert:
		if a.minter == nil {
			return nil, id, unauthenticated("client certificate of %q accepted, but with etcd's simple tokens this server cannot act as a user without a password: run the server with %s jwt (one member) or jwt,pub-key=...,priv-key=...,sign-method=ES256 (the same files on every member), or send Basic credentials", id.user, a.setting.Name("Config.Security.AuthToken"))
		}
		if _, err := a.srv.AuthStore().UserGet(&pb.AuthUserGetRequest{Name: id.user}); err != nil {
			return nil, id, unauthenticated("the client certificate names %q, which is not an etcd user: add the user (etcdctl user add %s --no-password) or issue the certificate with another CN", id.user, id.user)
		}
		src := &tokenSource{maxAge: a.minter.ttl / 2, fetch: func(context.Context) (string, error) {
			return a.minter.mint(id.user, a.srv.AuthStore().Revision())
		}}
		return ownedStore(userClient(a.srv, src, lg)), id, nil
	}
	return nil, id, fmt.Errorf("unknown authentication method %q", id.method)
}

// frontAuthority serves identities from an external etcd cluster, with a
// client per identity.
type frontAuthority struct {
	cfg     etcdstore.Config // endpoints and TLS, without credentials
	self    *clientv3.Client // the server's own client
	minter  *jwtMinter
	log     *slog.Logger
	setting setting.Namer // names the settings its answers suggest

	mu      sync.Mutex
	checked time.Time
	on      bool
	rev     uint64 // auth revision, as of checked
}

// authStatusTTL is how long the external cluster's auth status is cached.
const authStatusTTL = 2 * time.Second

func (a *frontAuthority) enabled(ctx context.Context) (bool, error) {
	a.mu.Lock()
	defer a.mu.Unlock()
	if time.Since(a.checked) < authStatusTTL {
		return a.on, nil
	}
	resp, err := a.self.AuthStatus(ctx)
	if err != nil {
		return a.on, fmt.Errorf("%w: ask etcd whether authentication is enabled: %w", store.ErrUnavailable, err)
	}
	a.on, a.rev, a.checked = resp.Enabled, resp.AuthRevision, time.Now()
	return a.on, nil
}

// revision is the external cluster's auth revision, as cached with the
// auth status (at most authStatusTTL old).
func (a *frontAuthority) revision(ctx context.Context) (uint64, error) {
	if _, err := a.enabled(ctx); err != nil {
		return 0, err
	}
	a.mu.Lock()
	defer a.mu.Unlock()
	return a.rev, nil
}

func (a *frontAuthority) token(ctx context.Context, user, password string) (string, error) {
	resp, err := a.self.Authenticate(ctx, user, password)
	if err != nil {
		return "", explainAuthError(identity{method: methodBasic, user: user}, err)
	}
	return resp.Token, nil
}

func (a *frontAuthority) open(ctx context.Context, id identity) (*etcdstore.Store, identity, error) {
	cfg := a.cfg
	cfg.Logger = a.log
	switch id.method {
	case methodBasic:
		cfg.Username, cfg.Password = id.user, id.password
	case methodBearer:
		tok := id.token
		cfg.Configure = func(c *clientv3.Config) { c.Token = tok }
	case methodCert:
		if a.minter == nil {
			return nil, id, unauthenticated("client certificate of %q accepted, but this server cannot act as an etcd user without a password: give it the cluster's JWT signing key (%s jwt,priv-key=...) or send Basic credentials", id.user, a.setting.Name("Config.Security.AuthToken"))
		}
		st, err := a.self.AuthStatus(ctx)
		if err != nil {
			return nil, id, fmt.Errorf("%w: %w", store.ErrUnavailable, err)
		}
		tok, err := a.minter.mint(id.user, st.AuthRevision)
		if err != nil {
			return nil, id, err
		}
		cfg.Configure = func(c *clientv3.Config) { c.Token = tok }
	default:
		return nil, id, fmt.Errorf("unknown authentication method %q", id.method)
	}
	s, err := etcdstore.Open(ctx, cfg)
	if err != nil {
		return nil, id, explainAuthError(id, err)
	}
	return s, id, nil
}

// userView is what the HTTP API uses to act as one etcd user: a client,
// a store and a registry over it, which holds no watch (the user's watches
// come from the server's registry, userRegistry). Views are cached
// (authViews) and shared by the user's concurrent requests.
type userView struct {
	id  identity
	rev uint64           // etcd's auth revision when id was authenticated
	cli *clientv3.Client // st's client
	st  *etcdstore.Store
	reg *registry.StoreRegistry

	// Guarded by authViews.mu.
	refs     int
	lastUsed time.Time
	closed   bool
}

func (v *userView) close() {
	_ = v.reg.Close()
	_ = v.st.Close()
}

// authViews caches user views, at most max of them, closing those idle
// for viewIdle.
type authViews struct {
	auth   authority
	regCfg registry.Config
	salt   []byte
	max    int
	log    *slog.Logger
	now    func() time.Time

	mu    sync.Mutex
	views map[string]*userView
}

// viewIdle is how long an unused view stays open.
const viewIdle = 5 * time.Minute

func newAuthViews(a authority, regCfg registry.Config, max int, log *slog.Logger, now func() time.Time) *authViews {
	return &authViews{auth: a, regCfg: regCfg, salt: newSalt(), max: max, log: log, now: now, views: map[string]*userView{}}
}

// newSalt is a per-process salt for the hashed keys of credentials.
func newSalt() []byte {
	salt := make([]byte, 16)
	_, _ = randRead(salt)
	return salt
}

// cached returns the open view of id, acquired, or nil. A view
// authenticated before auth revision rev (users, passwords or roles have
// changed since) is dropped and not returned: its credentials must be
// checked again, or a changed password would keep working here.
func (v *authViews) cached(id identity, rev uint64) *userView {
	key := id.key(v.salt)
	v.mu.Lock()
	uv, ok := v.views[key]
	if !ok || uv.closed {
		v.mu.Unlock()
		return nil
	}
	if uv.rev >= rev {
		uv.refs++
		uv.lastUsed = v.now()
		v.mu.Unlock()
		return uv
	}
	v.mu.Unlock()
	v.drop(uv)
	return nil
}

// acquire returns the view of id, opening it if needed; release it when
// the request ends.
func (v *authViews) acquire(ctx context.Context, id identity) (*userView, error) {
	key := id.key(v.salt)
	// The revision is read before the credentials are checked, so that a
	// change in between makes the next request check them again.
	rev, err := v.auth.revision(ctx)
	if err != nil {
		return nil, err
	}
	if uv := v.cached(id, rev); uv != nil {
		return uv, nil
	}

	st, id, err := v.auth.open(ctx, id)
	if err != nil {
		return nil, err
	}
	cfg := v.regCfg
	cfg.Metrics = nil // one set of metrics: the server's own registry
	cfg.Logger = v.log.With("etcd_user", id.user)
	reg, err := registry.New(st, cfg)
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	var evictOld *userView
	uv := &userView{id: id, rev: rev, cli: st.Client(), st: st, reg: reg, refs: 1, lastUsed: v.now()}

	v.mu.Lock()
	if old, ok := v.views[key]; ok && !old.closed && old.rev >= rev {
		// Opened concurrently: keep the first.
		old.refs++
		old.lastUsed = v.now()
		v.mu.Unlock()
		uv.close()
		return old, nil
	}
	if old, ok := v.views[key]; ok && !old.closed {
		// Stale (an older auth revision): replaced. Unused, it closes
		// now; in use, with its last request (release).
		old.closed = true
		if old.refs == 0 {
			evictOld = old
		}
	}
	v.views[key] = uv
	evict := v.evictLocked(len(v.views) - v.max)
	v.mu.Unlock()
	if evictOld != nil {
		evictOld.close()
	}
	for _, e := range evict {
		e.close()
	}
	return uv, nil
}

// evictLocked removes up to n unused views, least recently used first.
func (v *authViews) evictLocked(n int) []*userView {
	var out []*userView
	for n > 0 {
		var oldKey string
		var oldest *userView
		for k, uv := range v.views {
			if uv.refs == 0 && (oldest == nil || uv.lastUsed.Before(oldest.lastUsed)) {
				oldKey, oldest = k, uv
			}
		}
		if oldest == nil {
			break // all in use: allow more for now
		}
		oldest.closed = true
		delete(v.views, oldKey)
		out = append(out, oldest)
		n--
	}
	return out
}

func (v *authViews) release(uv *userView) {
	v.mu.Lock()
	uv.refs--
	uv.lastUsed = v.now()
	// A view dropped while in use closes with its last request.
	last := uv.closed && uv.refs == 0
	v.mu.Unlock()
	if last {
		uv.close()
	}
}

// drop closes the view of an identity whose credentials etcd no longer
// accepts (a changed password, an expired token).
func (v *authViews) drop(uv *userView) {
	v.mu.Lock()
	for k, cur := range v.views {
		if cur == uv {
			delete(v.views, k)
		}
	}
	uv.closed = true
	busy := uv.refs > 0
	v.mu.Unlock()
	if !busy {
		uv.close()
	}
}

// sweep closes views idle for viewIdle and the closed views no request
// holds any more.
func (v *authViews) sweep() {
	v.mu.Lock()
	var idle []*userView
	for k, uv := range v.views {
		if uv.refs == 0 && v.now().Sub(uv.lastUsed) > viewIdle {
			uv.closed = true
			delete(v.views, k)
			idle = append(idle, uv)
		}
	}
	v.mu.Unlock()
	for _, uv := range idle {
		uv.close()
	}
}

// closeAll closes every view.
func (v *authViews) closeAll() {
	v.mu.Lock()
	all := make([]*userView, 0, len(v.views))
	for k, uv := range v.views {
		uv.closed = true
		if uv.refs == 0 {
			all = append(all, uv)
		}
		delete(v.views, k)
	}
	v.mu.Unlock()
	for _, uv := range all {
		uv.close()
	}
}

// viewKey carries a request's user view in its context.
type viewKey struct{}

func viewFrom(ctx context.Context) *userView {
	uv, _ := ctx.Value(viewKey{}).(*userView)
	return uv
}

// remoteHost is the request's client address without the port.
func remoteHost(r *http.Request) string {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}
