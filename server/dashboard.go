package server

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server/ui"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/version"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.etcd.io/etcd/server/v3/etcdserver"
	"go.etcd.io/etcd/server/v3/storage"
	"go.uber.org/zap"
)

// ClusterPath is the read API of the backend under the registry: etcd's
// members with their status, or the health of another backend, and the
// registry session. The dashboard's Cluster page reads it.
const ClusterPath = "/v1/cluster"

const (
	// memberStatusTimeout bounds the status call to one etcd member: a
	// member that hangs is reported unhealthy, not waited for.
	memberStatusTimeout = 2 * time.Second
	// clusterCacheTTL is how long one answer of ClusterPath serves every
	// caller: many open dashboards cost etcd one round of status calls
	// per second at most.
	clusterCacheTTL = time.Second
)

// router is what mountDashboard registers its routes on: the server's mux.
type router interface {
	Handle(pattern string, h http.Handler)
	HandleFunc(pattern string, f func(http.ResponseWriter, *http.Request))
}

// mountDashboard serves the web dashboard at ui.Prefix (and redirects / to
// it) and the cluster read API it needs.
func (s *Server) mountDashboard(mux router) error {
	h, err := ui.New(ui.Config{})
	if err != nil {
		return err
	}
	mux.Handle("GET "+ui.Prefix, h)
	mux.Handle("GET /{$}", http.RedirectHandler(ui.Prefix, http.StatusFound))
	// The dashboard asks who the caller is where the server can tell
	// (authentication adds GET /v1/auth/whoami), and lists the discovery
	// tokens where the token API can.
	c := &clusterAPI{s: s, sem: make(chan struct{}, 1),
		whoami: routed(mux, http.MethodGet, whoAmIPath), tokenList: routed(mux, http.MethodGet, tokensPath)}
	mux.HandleFunc("GET "+ClusterPath, c.serve)
	if _, ok := mux.(interface {
		Serves(method, path string) bool
	}); !ok {
		// A router that does not answer other methods itself.
		mux.HandleFunc(ClusterPath, func(w http.ResponseWriter, r *http.Request) {
			w.Header().Set("Allow", "GET, HEAD")
			httpapi.WriteError(w, http.StatusMethodNotAllowed, httpapi.CodeMethodNotAllowed,
				fmt.Sprintf("%s is not allowed on %s: it is read-only; use GET", r.Method, ClusterPath))
		})
	}
	return nil
}

// ClusterStatus is the answer to GET /v1/cluster.
type ClusterStatus struct {
	// Backend names the registry's store: etcd, memory, file, nats, ...
	Backend string `json:"backend"`
	// Description says where the data is, as `beacon serve` prints it
	// ("embedded etcd", "external etcd at ...").
	Description string `json:"description"`
	// Time is when the status was taken.
	Time time.Time `json:"time"`
	// Health is a read of the store through the registry's backend.
	Health BackendHealth `json:"health"`
	// Etcd is set when the backend is etcd.
	Etcd *EtcdCluster `json:"etcd,omitempty"`
	// Session is the state of the registry's own session, when the
	// registry reports one.
	Session *SessionStatus `json:"session,omitempty"`
	// Features say which optional APIs this server offers.
	Features Features `json:"features"`
}

// BackendHealth is the result of one read of the store.
type BackendHealth struct {
	// Status is "ok" or "unavailable".
	Status string `json:"status"`
	// LatencyMS is how long the read took.
	LatencyMS float64 `json:"latency_ms"`
	// Error says why the read failed.
	Error string `json:"error,omitempty"`
}

// EtcdCluster describes the etcd cluster under the registry.
type EtcdCluster struct {
	ClusterID string `json:"cluster_id,omitempty"`
	// Leader is the leader's member ID (hex), as the members report it;
	// empty when no member knows one.
	Leader  string       `json:"leader,omitempty"`
	Members []EtcdMember `json:"members"`
	// Error says why the member list could not be read.
	Error string `json:"error,omitempty"`
}

// EtcdMember is one member with the status it reports. The status fields
// are zero when the member did not answer.
type EtcdMember struct {
	ID         string   `json:"id"`
	Name       string   `json:"name"`
	PeerURLs   []string `json:"peer_urls"`
	ClientURLs []string `json:"client_urls"`
	Learner    bool     `json:"learner"`
	Leader     bool     `json:"leader"`
	// Healthy: the member answered its status within the timeout, knows a
	// leader and reports no alarm.
	Healthy bool `json:"healthy"`
	// Health is "ok" or why the member is not healthy.
	Health           string   `json:"health"`
	Version          string   `json:"version,omitempty"`
	RaftTerm         uint64   `json:"raft_term,omitempty"`
	RaftIndex        uint64   `json:"raft_index,omitempty"`
	RaftAppliedIndex uint64   `json:"raft_applied_index,omitempty"`
	DBSize           int64    `json:"db_size_bytes,omitempty"`
	DBSizeInUse      int64    `json:"db_size_in_use_bytes,omitempty"`
	DBSizeQuota      int64    `json:"db_size_quota_bytes,omitempty"`
	Revision         int64    `json:"revision,omitempty"`
	Alarms           []string `json:"alarms,omitempty"`
}

// SessionStatus is the state of the registry's session (see
// registry.SessionReporter).
type SessionStatus struct {
	// State is idle, active, lost, recovered or closed.
	State           string  `json:"state"`
	LeaseTTLSeconds float64 `json:"lease_ttl_seconds,omitempty"`
}

// Features say which optional APIs the server offers.
type Features struct {
	// DiscoveryTokens: /v1/tokens (the backend is etcd).
	DiscoveryTokens bool `json:"discovery_tokens"`
	// HTTPRegistration: POST /v1/registry/instances (the registry has
	// leases of its own per registration).
	HTTPRegistration bool `json:"http_registration"`
	// Auth: GET /v1/auth/whoami says who the caller is and what the HTTP
	// API allows it; the dashboard offers actions only where it says so.
	Auth bool `json:"auth"`
	// TokenList: GET /v1/tokens lists every discovery token.
	TokenList bool `json:"token_list"`
}

// whoAmIPath is where the HTTP API's authentication says who the caller
// is and what it may do.
const whoAmIPath = "/v1/auth/whoami"

// routed reports whether mux has a route for method and path: one
// registered for that method (a route for any method may refuse it).
func routed(mux router, method, path string) bool {
	switch m := mux.(type) {
	case interface {
		Serves(method, path string) bool
	}:
		return m.Serves(method, path)
	case *http.ServeMux:
		r, err := http.NewRequest(method, path, nil)
		if err != nil {
			return false
		}
		_, pattern := m.Handler(r)
		return strings.HasPrefix(pattern, method+" ")
	}
	return false
}

// tokensPath is the token API (package bootstrap).
const tokensPath = "/v1/tokens"

type clusterAPI struct {
	whoami    bool
	tokenList bool
	s         *Server
	sem       chan struct{} // one status round at a time
	mu        sync.Mutex
	last      *ClusterStatus
}

func (c *clusterAPI) serve(w http.ResponseWriter, r *http.Request) {
	if r.URL.RawQuery != "" {
		httpapi.WriteError(w, http.StatusBadRequest, httpapi.CodeInvalidArgument, ClusterPath+" takes no query parameters")
		return
	}
	st, err := c.status(r.Context())
	if err != nil {
		httpapi.WriteError(w, http.StatusServiceUnavailable, httpapi.CodeUnavailable, "request ended: "+err.Error())
		return
	}
	w.Header().Set("Cache-Control", "no-store")
	httpapi.WriteJSON(w, http.StatusOK, st)
}

// status returns a status at most clusterCacheTTL old, taking a new one
// when needed; concurrent callers share one round of calls.
func (c *clusterAPI) status(ctx context.Context) (*ClusterStatus, error) {
	select {
	case c.sem <- struct{}{}:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	defer func() { <-c.sem }()
	c.mu.Lock()
	last := c.last
	c.mu.Unlock()
	if last != nil && time.Since(last.Time) < clusterCacheTTL {
		return last, nil
	}
	// Not the request's context: the answer serves the callers that wait.
	sctx, cancel := context.WithTimeout(context.Background(), memberStatusTimeout+readyTimeout)
	defer cancel()
	st := c.s.clusterStatus(sctx)
	st.Features.Auth, st.Features.TokenList = c.whoami, c.tokenList
	c.mu.Lock()
	c.last = st
	c.mu.Unlock()
	return st, nil
}

func (s *Server) clusterStatus(ctx context.Context) *ClusterStatus {
	st := &ClusterStatus{
		Backend:     s.backendName(),
		Description: s.Endpoints().Backend,
		Time:        time.Now(),
	}
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		st.Health = s.backendHealth(ctx)
	}()
	cli := s.etcdClient()
	if cli != nil {
		st.Etcd = s.etcdStatus(ctx, cli)
	}
	wg.Wait()
	var reg any = s.data.registry
	if sr, ok := reg.(registry.SessionReporter); ok && s.data.registry != nil {
		st.Session = &SessionStatus{State: sr.State().String()}
		if t, ok := reg.(interface{ LeaseTTL() time.Duration }); ok {
			st.Session.LeaseTTLSeconds = t.LeaseTTL().Seconds()
		}
	}
	_, leased := reg.(registry.LeasedRegistrar)
	st.Features = Features{DiscoveryTokens: cli != nil, HTTPRegistration: leased}
	return st
}

func (s *Server) backendName() string {
	switch {
	case s.member.etcd != nil, s.etcdClient() != nil:
		return "etcd"
	case s.cfg.Store != nil:
		if _, ok := s.cfg.Store.(*etcdstore.Store); ok {
			return "etcd"
		}
		return fmt.Sprintf("%T", s.cfg.Store)
	default:
		return s.cfg.Backend.BackendName()
	}
}

// backendHealth reads the store once, as /readyz does (or, for a registry
// backend without a store, pings it).
func (s *Server) backendHealth(ctx context.Context) BackendHealth {
	ctx, cancel := context.WithTimeout(ctx, readyTimeout)
	defer cancel()
	start := time.Now()
	var err error
	var d any = s.data.registry
	switch reg, isReg := d.(registry.Discoverer); {
	case s.data.store != nil:
		_, _, err = s.data.store.List(ctx, "/beacon-readyz-probe/")
	case isReg:
		// A registry backend without a store (kubernetes): as /readyz.
		if p, ok := d.(interface{ Ping(context.Context) error }); ok {
			err = p.Ping(ctx)
		} else {
			_, _, err = reg.List(ctx, beacon.Query{Namespace: "beacon-health-probe"})
		}
	default:
		err = errors.New("no store and no registry")
	}
	h := BackendHealth{Status: "ok", LatencyMS: float64(time.Since(start).Microseconds()) / 1000}
	if err != nil {
		h.Status, h.Error = "unavailable", err.Error()
	}
	return h
}

// etcdStatus lists the members and asks each for its status, in parallel,
// each bounded by memberStatusTimeout. The embedded member answers from
// the etcd server in this process; the others through cli's maintenance
// API (etcd's Status call).
func (s *Server) etcdStatus(ctx context.Context, cli *clientv3.Client) *EtcdCluster {
	out := &EtcdCluster{Members: []EtcdMember{}}
	var members []*etcdserverpb.Member
	var local *etcdserver.EtcdServer
	if s.member.etcd != nil {
		local = s.member.etcd.Server
		out.ClusterID = hexID(uint64(local.Cluster().ID()))
		for _, m := range local.Cluster().Members() {
			members = append(members, &etcdserverpb.Member{ID: uint64(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, IsLearner: m.IsLearner})
		}
		slices.SortFunc(members, func(a, b *etcdserverpb.Member) int { return cmp.Compare(a.ID, b.ID) })
	} else {
		lctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
		ml, err := cli.MemberList(lctx)
		cancel()
		if err != nil {
			out.Error = err.Error()
			return out
		}
		if ml.Header != nil {
			out.ClusterID = hexID(ml.Header.ClusterId)
		}
		members = ml.Members
	}
	out.Members = make([]EtcdMember, len(members))
	leaders := make([]uint64, len(members))
	var wg sync.WaitGroup
	for i, m := range members {
		out.Members[i] = EtcdMember{
			ID: hexID(m.ID), Name: m.Name, PeerURLs: m.PeerURLs, ClientURLs: m.ClientURLs, Learner: m.IsLearner,
		}
		if out.Members[i].ClientURLs == nil {
			out.Members[i].ClientURLs = []string{}
		}
		if local != nil && uint64(local.MemberID()) == m.ID {
			leaders[i] = fillStatus(&out.Members[i], localStatus(local))
			continue
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			leaders[i] = s.memberStatus(ctx, cli, &out.Members[i])
		}()
	}
	wg.Wait()
	// The leader as most answering members see it.
	votes := map[uint64]int{}
	var leader uint64
	for _, l := range leaders {
		if l == 0 {
			continue
		}
		votes[l]++
		if votes[l] > votes[leader] {
			leader = l
		}
	}
	if leader != 0 {
		out.Leader = hexID(leader)
		for i := range out.Members {
			out.Members[i].Leader = out.Members[i].ID == out.Leader
		}
	}
	return out
}

// memberStatus fills m with the member's status and returns the leader it
// reports (0 when it did not answer).
func (s *Server) memberStatus(ctx context.Context, cli *clientv3.Client, m *EtcdMember) uint64 {
	if len(m.ClientURLs) == 0 {
		m.Health = "not started: the member was added but has not joined yet"
		if m.Name != "" {
			m.Health = "no client URL to ask"
		}
		return 0
	}
	var errs []string
	for _, u := range m.ClientURLs {
		sctx, cancel := context.WithTimeout(ctx, memberStatusTimeout)
		resp, err := s.statusOf(sctx, cli, u)
		cancel()
		if err == nil && resp.Header != nil && resp.Header.MemberId != 0 && hexID(resp.Header.MemberId) != m.ID {
			err = fmt.Errorf("answered as member %s", hexID(resp.Header.MemberId))
		}
		if err != nil {
			errs = append(errs, fmt.Sprintf("%s: %v", u, err))
			continue
		}
		return fillStatus(m, resp)
	}
	m.Health = "did not answer within " + memberStatusTimeout.String() + ": " + strings.Join(errs, "; ")
	return 0
}

// statusOf asks the member at url for its status: through cli's
// maintenance API, or, when cli has none (the server's in-process client of
// its embedded member reaches only that member), over a short-lived client
// of that URL with the embedded member's client TLS and the server's own
// etcd credentials.
func (s *Server) statusOf(ctx context.Context, cli *clientv3.Client, url string) (*etcdserverpb.StatusResponse, error) {
	if cli.Maintenance != nil {
		resp, err := cli.Status(ctx, url)
		return (*etcdserverpb.StatusResponse)(resp), err
	}
	if s.member.etcd == nil {
		return nil, errors.New("this server's etcd client cannot ask members for their status")
	}
	cfg := clientv3.Config{Endpoints: []string{url}, DialTimeout: memberStatusTimeout, Logger: zap.NewNop(), Context: ctx}
	if strings.HasPrefix(url, "https://") {
		tlsCfg, err := s.member.etcd.Config().ClientTLSInfo.ClientConfig()
		if err != nil {
			return nil, fmt.Errorf("client TLS: %w", err)
		}
		cfg.TLS = tlsCfg
	}
	if user, pw, err := s.selfCredentials(); err == nil && user != "" {
		cfg.Username, cfg.Password = user, pw
	}
	c, err := clientv3.New(cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	resp, err := c.Status(ctx, url)
	return (*etcdserverpb.StatusResponse)(resp), err
}

// fillStatus copies a member's status into m and returns the leader it
// reports.
func fillStatus(m *EtcdMember, resp *etcdserverpb.StatusResponse) uint64 {
	m.Version = resp.Version
	m.RaftTerm, m.RaftIndex, m.RaftAppliedIndex = resp.RaftTerm, resp.RaftIndex, resp.RaftAppliedIndex
	m.DBSize, m.DBSizeInUse, m.DBSizeQuota = resp.DbSize, resp.DbSizeInUse, resp.DbSizeQuota
	if resp.Header != nil {
		m.Revision = resp.Header.Revision
	}
	m.Alarms = resp.Errors
	switch {
	case len(resp.Errors) > 0:
		m.Health = "alarm: " + strings.Join(resp.Errors, "; ")
	case resp.Leader == 0:
		m.Health = "no leader: the member cannot reach a quorum"
	default:
		m.Healthy, m.Health = true, "ok"
	}
	return resp.Leader
}

// localStatus is etcd's Status answer of the member running in this
// process, read from the server itself (no RPC, no credentials).
func localStatus(es *etcdserver.EtcdServer) *etcdserverpb.StatusResponse {
	resp := &etcdserverpb.StatusResponse{
		Header:           &etcdserverpb.ResponseHeader{ClusterId: uint64(es.Cluster().ID()), MemberId: uint64(es.MemberID()), Revision: es.KV().Rev(), RaftTerm: es.Term()},
		Version:          version.Version,
		Leader:           uint64(es.Leader()),
		RaftIndex:        es.CommittedIndex(),
		RaftAppliedIndex: es.AppliedIndex(),
		RaftTerm:         es.Term(),
		DbSize:           es.Backend().Size(),
		DbSizeInUse:      es.Backend().SizeInUse(),
		IsLearner:        es.IsLearner(),
		DbSizeQuota:      es.Cfg.QuotaBackendBytes,
	}
	if resp.DbSizeQuota == 0 {
		resp.DbSizeQuota = storage.DefaultQuotaBytes
	}
	if resp.Leader == 0 {
		resp.Errors = append(resp.Errors, "etcdserver: no leader")
	}
	for _, a := range es.Alarms() {
		resp.Errors = append(resp.Errors, a.String())
	}
	return resp
}

func hexID(id uint64) string { return strconv.FormatUint(id, 16) }
