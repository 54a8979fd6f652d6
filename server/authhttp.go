package server

import (
	"context"
	"crypto/rand"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"slices"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon"
	v2 "github.com/beaconplane/beacon/bootstrap/v2"
	"github.com/beaconplane/beacon/internal/zapslog"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/registryapi"
	"github.com/beaconplane/beacon/store"
	"go.etcd.io/etcd/api/v3/authpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"go.uber.org/zap/zapcore"
)

// Paths of the authentication API.
const (
	WhoAmIPath = "/v1/auth/whoami"
	TokenPath  = "/v1/auth/token"
)

func randRead(b []byte) (int, error) { return rand.Read(b) }

// zapFor adapts the server logger for etcd clients (warnings and above).
func zapFor(l *slog.Logger) *zap.Logger {
	return zapslog.New(l.With("component", "etcd-client"), zapcore.WarnLevel)
}

// setupAuth builds the authority of the server's backend and the cache of
// user views, and starts the janitor that closes idle views.
func (s *Server) setupAuth() error {
	var a authority
	switch {
	case s.member.etcd != nil:
		m, err := newJWTMinter(s.authToken)
		if err != nil {
			return err
		}
		a = &embeddedAuthority{srv: s.member.etcd.Server, minter: m, log: s.log, setting: s.cfg.namer()}
	case s.cfg.Backend.BackendName() == "etcd" && s.etcdClient() != nil && s.cfg.Store == nil:
		cfg := s.cfg.Backend.Etcd
		if len(s.cfg.EtcdEndpoints) > 0 {
			cfg.Endpoints = s.cfg.EtcdEndpoints
		}
		if s.fallbackProxy() != nil {
			// The cluster through the discovery fallback proxy.
			cfg = s.fallbackStore
		}
		cfg.Username, cfg.Password, cfg.Configure = "", "", nil
		var m *jwtMinter
		if s.sec.AuthToken != "" {
			var err error
			if m, err = newJWTMinter(s.sec.AuthToken); err != nil {
				return err
			}
		}
		a = &frontAuthority{cfg: cfg, self: s.etcdClient(), minter: m, log: s.log, setting: s.cfg.namer()}
	}
	if a == nil {
		return nil
	}
	rcfg := s.cfg.Registry
	rcfg.Logger = s.log
	// Requests served while the server starts read it concurrently.
	s.authnPtr.Store(newAuthenticator(a, authOptions{
		Registry: rcfg, MaxViews: s.sec.MaxAuthClients, Log: s.log.With("component", "auth"),
	}))
	return nil
}

// authn returns the server's authenticator; the zero one (no authority)
// before setupAuth, and for backends without users.
func (s *Server) authn() *authenticator {
	if n := s.authnPtr.Load(); n != nil {
		return n
	}
	return &authenticator{}
}

// closeSecurity closes the authenticator (every user view).
func (s *Server) closeSecurity() {
	if n := s.authnPtr.Load(); n != nil {
		n.close()
	}
}

// registryOptions are the registry API's options for authentication and
// limits.
func (s *Server) registryOptions(o registryapi.Config) registryapi.Config {
	o.Registry = func(r *http.Request) (registry.Discoverer, error) {
		if uv := viewFrom(r.Context()); uv != nil {
			return &userRegistry{StoreRegistry: uv.reg, shared: s.data.registry, n: s.authn(), uv: uv, self: s.selfUser}, nil
		}
		return nil, nil
	}
	// Operator actions act only as an authenticated etcd user, through
	// that user's view: etcd's roles decide. Without authentication there
	// is nobody to act as, and they are refused.
	o.Operators = func(r *http.Request) (registry.Discoverer, string) {
		if uv := viewFrom(r.Context()); uv != nil {
			return uv.reg, uv.id.user
		}
		return nil, ""
	}
	o.Limits = s.sec.Limits
	if o.Limits.Client == nil {
		o.Limits.Client = func(r *http.Request) string {
			if uv := viewFrom(r.Context()); uv != nil && uv.id.user != "" {
				return "user " + strconv.Quote(uv.id.user)
			}
			return ""
		}
	}
	return o
}

// publicPath reports the routes served without authentication: health,
// metrics, the API description, the authentication API (which handles
// credentials itself), and the dashboard's static files.
func publicPath(r *http.Request) bool {
	if r.Method == http.MethodOptions && r.Header.Get("Access-Control-Request-Method") != "" {
		return true // a CORS preflight carries no credentials
	}
	switch r.URL.Path {
	case "/healthz", "/readyz", "/metrics", "/v1/openapi.json", WhoAmIPath, TokenPath:
		return true
	}
	return (r.Method == http.MethodGet || r.Method == http.MethodHead) && (r.URL.Path == "/ui" || strings.HasPrefix(r.URL.Path, "/ui/"))
}

// errorBody is the JSON body of every error the security layer writes (the
// registry API's shape).
type errorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

func writeErr(w http.ResponseWriter, code int, kind, msg string) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(errorBody{Code: kind, Message: msg})
}

func writeUnauthorized(w http.ResponseWriter, msg string) {
	w.Header().Set("WWW-Authenticate", `Basic realm="beacon", charset="UTF-8"`)
	w.Header().Add("WWW-Authenticate", `Bearer realm="beacon"`)
	writeErr(w, http.StatusUnauthorized, "unauthenticated", msg)
}

// authResult is the outcome of authenticating a request.
type authResult struct {
	enabled bool      // etcd auth is on
	view    *userView // nil when !enabled or no credentials
}

// authenticate authenticates r when etcd authentication is on. It writes
// the refusal and returns ok=false when the request may not proceed;
// without credentials it returns no view and leaves the refusal to the
// caller (whoami answers it).
func (s *Server) authenticate(w http.ResponseWriter, r *http.Request, required bool) (authResult, bool) {
	st := s.authn()
	if st.auth == nil {
		return authResult{}, true
	}
	on, err := st.auth.enabled(r.Context())
	if err != nil {
		writeErr(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return authResult{}, false
	}
	if !on {
		return authResult{}, true
	}
	id, ok, err := credentials(r)
	switch {
	case err != nil:
		writeUnauthorized(w, err.Error())
		return authResult{}, false
	case !ok && required:
		writeUnauthorized(w, errNoCredentials.Error()+": send the etcd user's name and password (HTTP Basic), an etcd token (Authorization: Bearer, from POST "+TokenPath+"), or a client certificate whose common name is the user")
		return authResult{}, false
	case !ok:
		return authResult{enabled: true}, true
	}
	uv, fail := st.checkIdentity(r.Context(), remoteHost(r), id)
	if fail != nil {
		fail.write(w)
		return authResult{}, false
	}
	return authResult{enabled: true, view: uv}, true
}

// statusWriter records the status of a response.
type statusWriter struct {
	http.ResponseWriter
	code int
}

func (s *statusWriter) WriteHeader(code int) {
	if s.code == 0 {
		s.code = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusWriter) Write(b []byte) (int, error) {
	if s.code == 0 {
		s.code = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

func (s *statusWriter) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

func (s *statusWriter) Unwrap() http.ResponseWriter { return s.ResponseWriter }

// requireAuth authenticates every request that is not public when etcd
// authentication is on, and serves it with the user's view in its context.
func (s *Server) requireAuth(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if publicPath(r) {
			next.ServeHTTP(w, r)
			return
		}
		res, ok := s.authenticate(w, r, true)
		if !ok {
			return
		}
		if res.view == nil {
			next.ServeHTTP(w, r)
			return
		}
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if sw.code == http.StatusUnauthorized {
				// etcd no longer accepts the view's credentials (a
				// changed password, an expired token): drop it.
				s.authn().views.drop(res.view)
			}
			s.authn().views.release(res.view)
		}()
		next.ServeHTTP(sw, r.WithContext(context.WithValue(r.Context(), viewKey{}, res.view)))
	})
}

// probe asks etcd, as the view's user, whether it may read (write=false)
// or write keys under prefix, without reading or writing anything: a
// transaction whose condition never holds, so that etcd checks the
// permissions of its operations and applies none.
func probe(ctx context.Context, cli *clientv3.Client, prefix string, write bool) error {
	op := clientv3.OpGet(prefix, clientv3.WithPrefix(), clientv3.WithCountOnly())
	if write {
		op = clientv3.OpPut(prefix+"beacon-permission-probe", "")
	}
	_, err := cli.Txn(ctx).If(clientv3.Compare(clientv3.CreateRevision(prefix), "<", 0)).Then(op).Commit()
	if err != nil {
		return etcdError("probe the permissions on "+prefix, err)
	}
	return nil
}

// etcdError maps an etcd client error to the store sentinels.
func etcdError(what string, err error) error {
	e := rpctypes.Error(err)
	switch {
	case errors.Is(e, rpctypes.ErrPermissionDenied):
		return fmt.Errorf("%w: %s: %w", store.ErrPermissionDenied, what, err)
	case errors.Is(e, rpctypes.ErrInvalidAuthToken), errors.Is(e, rpctypes.ErrAuthOldRevision),
		errors.Is(e, rpctypes.ErrUserEmpty), errors.Is(e, rpctypes.ErrAuthFailed):
		return fmt.Errorf("%w: %s: %w", store.ErrUnauthenticated, what, err)
	case errors.Is(err, store.ErrUnauthenticated), errors.Is(err, store.ErrPermissionDenied):
		return err
	}
	return fmt.Errorf("%w: %s: %w", store.ErrUnavailable, what, err)
}

// needPermission serves h only to users that may read (GET, HEAD, unless
// writes says the request writes) or write (other methods) under prefix;
// what names the resource in errors.
func (s *Server) needPermission(prefix, what string, writes func(*http.Request) bool, h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		uv := viewFrom(r.Context())
		if uv == nil {
			h.ServeHTTP(w, r)
			return
		}
		write := r.Method != http.MethodGet && r.Method != http.MethodHead || writes != nil && writes(r)
		if err := probe(r.Context(), uv.cli, prefix, write); err != nil {
			switch {
			case errors.Is(err, store.ErrPermissionDenied):
				verb, perm := "read", "read"
				if write {
					verb, perm = "change", "readwrite"
				}
				writeErr(w, http.StatusForbidden, "permission_denied", fmt.Sprintf(
					"permission denied: etcd user %q may not %s %s: grant it a role with %s on the key prefix %s (etcdctl role grant-permission ROLE %s %s --prefix)",
					uv.id.user, verb, what, perm, prefix, perm, prefix))
			case errors.Is(err, store.ErrUnauthenticated):
				writeUnauthorized(w, err.Error())
			default:
				writeErr(w, http.StatusServiceUnavailable, "unavailable", err.Error())
			}
			return
		}
		// The work is done as the server's own etcd user, which needs
		// the same permission (a least-privilege user limited to the
		// registry has none here).
		if cli := s.etcdClient(); cli != nil {
			if err := probe(r.Context(), cli, prefix, write); err != nil {
				if errors.Is(err, store.ErrPermissionDenied) || errors.Is(err, store.ErrUnauthenticated) {
					perm := "read"
					if write {
						perm = "readwrite"
					}
					writeErr(w, http.StatusForbidden, "permission_denied", fmt.Sprintf(
						"this server's own etcd user (%s) may not serve %s, which it reads and writes on behalf of its callers: grant it %s on the key prefix %s (beacon auth grant-bootstrap ROLE, then etcdctl user grant-role USER ROLE), or serve them from another server (%v)",
						s.selfUser(), what, perm, prefix, err))
					return
				}
				writeErr(w, http.StatusServiceUnavailable, "unavailable", err.Error())
				return
			}
		}
		h.ServeHTTP(w, r)
	})
}

// selfUser names the etcd user the server acts as, for messages.
func (s *Server) selfUser() string {
	if u := s.cfg.Backend.Etcd.Username; u != "" {
		return strconv.Quote(u) + ", " + s.cfg.setting("Config.Backend.Etcd.Username")
	}
	if s.member.etcd != nil {
		return `"root"`
	}
	return "none: give " + s.cfg.setting("Config.Backend.Etcd.Username")
}

// Key prefixes the bootstrap APIs write.
const (
	tokensPrefix = "/_etcd/registry/"
	v2Prefix     = v2.DefaultPrefix
)

// guardBootstrap wraps the tokens API and the v2 discovery service with
// their own permissions.
func (s *Server) guardTokens(h http.Handler) http.Handler {
	return s.needPermission(tokensPrefix, "v3 discovery tokens", nil, h)
}

func (s *Server) guardV2(h http.Handler) http.Handler {
	return s.needPermission(v2Prefix, "v2 discovery tokens", writesDespiteMethod, h) // csrf.go
}

// Access says what a user may do with one kind of data.
type Access struct {
	// Read: list, get and watch (registry), status (tokens).
	Read bool `json:"read"`
	// Write: register, heartbeat, update and deregister (registry),
	// create and remove (tokens).
	Write bool `json:"write"`
	// Operate (registry only): drain and deregister instances that other
	// clients registered (POST .../drain, .../deregister): readwrite on
	// the instance prefix, with etcd authentication on (without it there
	// is no operator identity, and these actions are refused).
	Operate bool `json:"operate,omitempty"`
}

// WhoAmI is the answer of GET /v1/auth/whoami: who the request
// authenticates as and what that user may do, so that a client (the
// dashboard) offers only the actions that will succeed.
type WhoAmI struct {
	// AuthEnabled is true when etcd authentication is on; without it
	// everyone may do everything the HTTP API offers, except operator
	// actions (Access.Operate), which need an authenticated user.
	AuthEnabled bool `json:"auth_enabled"`
	// Authenticated is true when the request carried valid credentials.
	Authenticated bool `json:"authenticated"`
	// User is the etcd user ("" when not authenticated, or for a bearer
	// token whose user cannot be told).
	User string `json:"user,omitempty"`
	// Method is basic, bearer or certificate.
	Method string `json:"method,omitempty"`
	// Roles are the user's etcd roles (when the user may read them).
	Roles []string `json:"roles,omitempty"`
	// Root is true for members of etcd's root role.
	Root bool `json:"root"`
	// AllNamespaces is what the user may do in every namespace of the
	// registry.
	AllNamespaces Access `json:"all_namespaces"`
	// Namespaces is what the user may do in each namespace its roles name.
	Namespaces map[string]Access `json:"namespaces"`
	// BootstrapTokens covers /v1/tokens; V2Discovery /v2/discovery.
	BootstrapTokens Access `json:"bootstrap_tokens"`
	V2Discovery     Access `json:"v2_discovery"`
}

// maxWhoAmINamespaces bounds the namespaces whoami probes.
const maxWhoAmINamespaces = 64

func (s *Server) mountAuth(mux interface {
	Handle(string, http.Handler)
},
) {
	mux.Handle("GET "+WhoAmIPath, http.HandlerFunc(s.whoami))
	mux.Handle("POST "+TokenPath, http.HandlerFunc(s.issueToken))
}

// guarded is a router that wraps every handler registered through it.
type guarded struct {
	r interface {
		Handle(string, http.Handler)
	}
	wrap func(http.Handler) http.Handler
}

func (g guarded) Handle(pattern string, h http.Handler) { g.r.Handle(pattern, g.wrap(h)) }

func (s *Server) whoami(w http.ResponseWriter, r *http.Request) {
	all := Access{Read: true, Write: true}
	res, ok := s.authenticate(w, r, false)
	if !ok {
		return
	}
	out := WhoAmI{AuthEnabled: res.enabled, Namespaces: map[string]Access{}}
	if !res.enabled {
		out.AllNamespaces, out.BootstrapTokens, out.V2Discovery = all, all, all
		writeJSONResp(w, http.StatusOK, out)
		return
	}
	uv := res.view
	if uv == nil {
		writeJSONResp(w, http.StatusOK, out)
		return
	}
	defer s.authn().views.release(uv)
	ctx := r.Context()
	out.Authenticated, out.User, out.Method = true, uv.id.user, uv.id.method
	ks := uv.reg.Keyspace()
	may := func(prefix string, write bool) bool { return probe(ctx, uv.cli, prefix, write) == nil }
	_, operable := s.data.registry.(registry.Operator)
	// access says what the user may do in namespace ns ("" for all).
	access := func(ns string) Access {
		prefix := ks.Prefix(beacon.Query{Namespace: ns})
		a := Access{Read: may(prefix, false)}
		writer := may(prefix, true)
		a.Write = writer && may(ks.OwnersPrefix(ns), true)
		a.Operate = operable && a.Read && writer
		return a
	}
	if uv.id.user != "" {
		if resp, err := uv.cli.UserGet(ctx, uv.id.user); err == nil {
			out.Roles = resp.Roles
			out.Root = slices.Contains(resp.Roles, "root")
			var names []string
			for _, role := range resp.Roles {
				rr, err := uv.cli.RoleGet(ctx, role)
				if err != nil {
					continue
				}
				names = append(names, namespacesOf(ks, rr.Perm)...)
			}
			slices.Sort(names)
			for _, ns := range slices.Compact(names) {
				if len(out.Namespaces) >= maxWhoAmINamespaces {
					break
				}
				out.Namespaces[ns] = access(ns)
			}
		}
	}
	out.AllNamespaces = access("")
	out.BootstrapTokens = Access{Read: may(tokensPrefix, false), Write: may(tokensPrefix, true)}
	out.V2Discovery = Access{Read: may(v2Prefix, false), Write: may(v2Prefix, true)}
	writeJSONResp(w, http.StatusOK, out)
}

// namespacesOf lists the namespaces whose instance prefix a role's
// permissions reach into.
func namespacesOf(ks beacon.Keyspace, perms []*authpb.Permission) []string {
	root := ks.Prefix(beacon.Query{})
	var out []string
	for _, p := range perms {
		rest, ok := strings.CutPrefix(string(p.Key), root)
		if !ok {
			continue
		}
		ns, _, _ := strings.Cut(rest, "/")
		if beacon.ValidateLabel("namespace", ns) == nil {
			out = append(out, ns)
		}
	}
	return out
}

// TokenResponse is the answer of POST /v1/auth/token.
type TokenResponse struct {
	// Token is an etcd token: send it as Authorization: Bearer <token>.
	Token string `json:"token"`
	User  string `json:"user"`
	// TTLSeconds is how long the token lives (for simple tokens, since
	// its last use); authenticate again when a request answers 401.
	TTLSeconds float64 `json:"ttl_seconds,omitempty"`
}

// issueToken exchanges Basic credentials for an etcd token, so that a
// browser keeps a token instead of a password.
func (s *Server) issueToken(w http.ResponseWriter, r *http.Request) {
	st := s.authn()
	if st.auth == nil {
		writeErr(w, http.StatusNotImplemented, "not_implemented", "this server's backend has no users: tokens exist only with etcd authentication")
		return
	}
	on, err := st.auth.enabled(r.Context())
	switch {
	case err != nil:
		writeErr(w, http.StatusServiceUnavailable, "unavailable", err.Error())
		return
	case !on:
		writeErr(w, http.StatusConflict, "failed_precondition", "etcd authentication is not enabled: no token is needed (start the server with "+s.cfg.setting("Config.Security.Auth")+" to enable it)")
		return
	}
	id, ok, err := credentials(r)
	switch {
	case err != nil:
		writeUnauthorized(w, err.Error())
		return
	case !ok || id.method != methodBasic:
		writeUnauthorized(w, "send the etcd user's name and password with HTTP Basic authentication to get a token")
		return
	}
	tok, fail := st.token(r.Context(), remoteHost(r), id)
	if fail != nil {
		fail.write(w)
		return
	}
	resp := TokenResponse{Token: tok, User: id.user}
	if s.member.etcd != nil {
		resp.TTLSeconds = s.sec.AuthTokenTTL.Seconds()
		if m, ok := st.auth.(*embeddedAuthority); ok && m.minter != nil {
			resp.TTLSeconds = m.minter.ttl.Seconds()
		}
	}
	w.Header().Set("Cache-Control", "no-store")
	writeJSONResp(w, http.StatusOK, resp)
}

func writeJSONResp(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

// rootOnly is a router whose handlers, with etcd authentication on, serve
// only members of etcd's root role: Go's profiles show the process's
// command line and stacks, and a CPU profile or trace costs the whole
// process, so they are the operator's, as etcd's own admin operations are.
// Without authentication they serve whoever reaches the listener, as
// etcd's --enable-pprof does.
type rootOnly struct {
	mux interface {
		HandleFunc(string, func(http.ResponseWriter, *http.Request))
	}
	s *Server
}

func (ro rootOnly) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	ro.mux.HandleFunc(pattern, func(w http.ResponseWriter, r *http.Request) {
		uv := viewFrom(r.Context())
		if uv == nil { // authentication off (requireAuth refused the rest)
			h(w, r)
			return
		}
		resp, err := uv.cli.UserGet(r.Context(), uv.id.user)
		if err != nil || !slices.Contains(resp.Roles, "root") {
			writeErr(w, http.StatusForbidden, "permission_denied", fmt.Sprintf(
				"user %q may not read the runtime profiles (/debug/pprof/: they show the command line and cost the whole process): only members of etcd's root role may (etcdctl user grant-role USER root)", uv.id.user))
			return
		}
		h(w, r)
	})
}
