package proxy

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"net/url"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/status"
)

// endpoint is one member client URL and what the proxy knows about it.
type endpoint struct {
	url         string
	hostport    string // from the URL
	addr        string // the address a probe connected to (resolved IP:port)
	failedUntil time.Time
	lastErr     string
	self        bool // the proxy's own listener: never used
	loop        bool // requests sent there came back: never used
	// unverified: the endpoint failed (a probe or a request) and must
	// answer a probe as etcd again before it is used, also once its
	// FailureWait is over.
	unverified bool
}

// EndpointStatus reports one endpoint, for Proxy.Endpoints and
// GET /proxy/endpoints.
type EndpointStatus struct {
	URL string `json:"url"`
	// State is "available" (it answered as etcd), "failed" (it did not
	// answer as etcd, or a request to it failed: benched for FailureWait,
	// then used again only once it answers as etcd), "self" (this proxy's
	// own address) or "loop" (requests came back to this proxy through
	// it).
	State     string    `json:"state"`
	LastError string    `json:"last_error,omitempty"`
	Until     time.Time `json:"until,omitzero"`
}

// director keeps the member endpoints in a shuffled order, benches failed
// ones for failureWait and hands the usable ones to set.
type director struct {
	// applyMu orders changes: replace and apply hold it from the moment
	// they change or read the endpoint states until set has returned, and
	// status holds it too. So set sees the states in the order they
	// happened, and an endpoint that status reports gone or benched gets
	// no new request (set updates the upstream pickers synchronously).
	// Lock order: applyMu before mu.
	applyMu     sync.Mutex
	mu          sync.Mutex
	eps         []*endpoint
	applied     []string
	failureWait time.Duration
	set         func([]string)
	// revive is called when an endpoint becomes usable again, so that
	// connections still backing off from its failure retry at once.
	revive  func()
	kick    chan struct{}
	log     *slog.Logger
	m       *metrics
	now     func() time.Time
	nAvail  atomic.Int32 // usable endpoints, for the request path
	nKnown  atomic.Int32 // endpoints that are not this proxy
	recheck atomic.Bool  // checkNow was called
}

// availableCount and knownCount are lock-free for the request path.
func (d *director) availableCount() int { return int(d.nAvail.Load()) }
func (d *director) knownCount() int     { return int(d.nKnown.Load()) }

func newDirector(failureWait time.Duration, log *slog.Logger, m *metrics) *director {
	return &director{failureWait: failureWait, kick: make(chan struct{}, 1), log: log, m: m, now: time.Now}
}

// replace installs a fresh endpoint list (shuffled). Failure and loop
// marks of endpoints that stay in the list are kept.
func (d *director) replace(list []*endpoint) {
	rand.Shuffle(len(list), func(i, j int) { list[i], list[j] = list[j], list[i] })
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	old := map[string]*endpoint{}
	for _, e := range d.eps {
		old[e.url] = e
	}
	for _, e := range list {
		if o := old[e.url]; o != nil {
			if o.failedUntil.After(e.failedUntil) {
				e.failedUntil, e.lastErr = o.failedUntil, o.lastErr
			}
			e.loop = e.loop || o.loop
		}
	}
	d.eps = list
	d.mu.Unlock()
	d.applyLocked()
}

// usable reports whether e may receive requests now.
func (e *endpoint) usable(now time.Time) bool {
	return !e.self && !e.loop && !e.unverified && !now.Before(e.failedUntil)
}

// available returns the URLs of usable endpoints, in shuffled order.
func (d *director) available() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	return d.availableLocked()
}

func (d *director) availableLocked() []string {
	now := d.now()
	var out []string
	for _, e := range d.eps {
		if e.usable(now) {
			out = append(out, e.url)
		}
	}
	return out
}

// known returns every endpoint URL that is not this proxy.
func (d *director) known() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	var out []string
	for _, e := range d.eps {
		if !e.self && !e.loop {
			out = append(out, e.url)
		}
	}
	return out
}

// apply hands the usable endpoints to set when they changed, and updates
// the metrics. With none usable the previous set stays (requests are
// refused before they reach it).
func (d *director) apply() {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.applyLocked()
}

// applyLocked is apply with applyMu held.
func (d *director) applyLocked() {
	d.mu.Lock()
	avail := d.availableLocked()
	revived := len(avail) > int(d.nAvail.Load())
	d.nAvail.Store(int32(len(avail)))
	known := 0
	for _, e := range d.eps {
		if !e.self && !e.loop {
			known++
		}
	}
	d.nKnown.Store(int32(known))
	changed := !sameSet(avail, d.applied) && len(avail) > 0
	if changed {
		d.applied = slices.Clone(avail)
	}
	d.updateMetricsLocked()
	set, revive := d.set, d.revive
	d.mu.Unlock()
	if changed && set != nil {
		set(avail)
	}
	if revived && revive != nil {
		revive()
	}
}

func sameSet(a, b []string) bool {
	if len(a) != len(b) {
		return false
	}
	a, b = slices.Clone(a), slices.Clone(b)
	slices.Sort(a)
	slices.Sort(b)
	return slices.Equal(a, b)
}

func (d *director) updateMetricsLocked() {
	if d.m == nil {
		return
	}
	now := d.now()
	counts := map[string]float64{"available": 0, "failed": 0, "self": 0, "loop": 0}
	d.m.endpointUp.Reset()
	for _, e := range d.eps {
		st := e.state(now)
		counts[st]++
		up := 0.0
		if st == "available" {
			up = 1
		}
		d.m.endpointUp.WithLabelValues(e.url).Set(up)
	}
	for st, n := range counts {
		d.m.endpoints.WithLabelValues(st).Set(n)
	}
}

func (e *endpoint) state(now time.Time) string {
	switch {
	case e.self:
		return "self"
	case e.loop:
		return "loop"
	case now.Before(e.failedUntil), e.unverified:
		return "failed"
	}
	return "available"
}

// status describes every endpoint, as the upstream connections use them
// (it waits for a change being applied).
func (d *director) status() []EndpointStatus {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	out := make([]EndpointStatus, 0, len(d.eps))
	for _, e := range d.eps {
		s := EndpointStatus{URL: e.url, State: e.state(now), LastError: e.lastErr}
		if s.State == "failed" {
			s.Until = e.failedUntil
		}
		out = append(out, s)
	}
	return out
}

// find returns the endpoint reached at addr (an IP:port a connection went
// to, or the host:port of its URL).
func (d *director) findLocked(addr string) *endpoint {
	for _, e := range d.eps {
		if e.addr == addr || e.hostport == addr {
			return e
		}
	}
	return nil
}

// urlAt returns the URL of the endpoint reached at addr ("" if unknown).
func (d *director) urlAt(addr string) string {
	d.mu.Lock()
	defer d.mu.Unlock()
	if e := d.findLocked(addr); e != nil {
		return e.url
	}
	return ""
}

// fail benches the endpoint at addr for failureWait. It reports whether
// an endpoint was benched now (false if unknown or already benched).
func (d *director) fail(addr string, err error) bool {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	e := d.findLocked(addr)
	now := d.now()
	if e == nil || now.Before(e.failedUntil) {
		d.mu.Unlock()
		return false
	}
	e.failedUntil = now.Add(d.failureWait)
	e.unverified = true
	if err != nil {
		e.lastErr = err.Error()
	}
	url := e.url
	d.mu.Unlock()
	d.log.Warn("marked endpoint unavailable", "endpoint", url, "for", d.failureWait, "err", err)
	if d.m != nil {
		d.m.upstreamErrors.WithLabelValues(url).Inc()
	}
	d.applyLocked()
	d.wake()
	return true
}

// markLoop excludes the endpoint at addr: a request sent there came back.
func (d *director) markLoop(addr string) {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	e := d.findLocked(addr)
	if e == nil || e.loop {
		d.mu.Unlock()
		return
	}
	e.loop = true
	url := e.url
	d.mu.Unlock()
	d.log.Warn("endpoint forwards back to this proxy (loop); not using it", "endpoint", url)
	if d.m != nil {
		d.m.loops.Inc()
	}
	d.applyLocked()
}

// toReprobe returns the endpoints whose FailureWait is over but that have
// not answered as etcd since they failed.
func (d *director) toReprobe() []string {
	d.mu.Lock()
	defer d.mu.Unlock()
	now := d.now()
	var out []string
	for _, e := range d.eps {
		if e.unverified && !e.self && !e.loop && !now.Before(e.failedUntil) {
			out = append(out, e.url)
		}
	}
	return out
}

// reprobed records the outcome of probing endpoints again: those that
// answered as etcd are used again, the others stay benched for another
// FailureWait.
func (d *director) reprobed(results []*endpoint) {
	d.applyMu.Lock()
	defer d.applyMu.Unlock()
	d.mu.Lock()
	for _, r := range results {
		for _, e := range d.eps {
			if e.url != r.url || !e.unverified {
				continue
			}
			if r.unverified {
				e.failedUntil, e.lastErr = r.failedUntil, r.lastErr
			} else {
				e.unverified, e.addr = false, r.addr
			}
		}
	}
	d.mu.Unlock()
	d.applyLocked()
}

// nextWake returns when the next benched endpoint becomes usable again
// (zero if none is benched).
func (d *director) nextWake() time.Time {
	d.mu.Lock()
	defer d.mu.Unlock()
	var t time.Time
	now := d.now()
	for _, e := range d.eps {
		switch {
		case e.self || e.loop:
		case e.failedUntil.After(now):
			if t.IsZero() || e.failedUntil.Before(t) {
				t = e.failedUntil
			}
		case e.unverified:
			return now // its bench is over: probe it again now
		}
	}
	return t
}

// checkNow asks the refresh loop to re-read the member list and probe
// every endpoint at once (at most every EmptyRefreshInterval): a request
// failed to connect to any of them, and a failure without a connection
// cannot be pinned on one endpoint. Endpoints that do not answer are
// then benched with the reason, so that /proxy/endpoints and /health agree
// within a probe instead of at the next periodic refresh.
func (d *director) checkNow() {
	if d.recheck.CompareAndSwap(false, true) {
		d.wake()
	}
}

func (d *director) wake() {
	select {
	case d.kick <- struct{}{}:
	default:
	}
}

// probe builds endpoints from client URLs: malformed URLs are dropped
// (logged), self addresses are marked, and each endpoint is asked for its
// status once (bounded by max(dialTimeout, probeTimeout)): an endpoint
// that cannot be reached, or that answers but not as etcd (another HTTP or
// gRPC server, a port that accepts and stays silent), starts benched with
// the reason. Only an endpoint that answered as etcd is available.
func probe(ctx context.Context, urls []string, self *selfMatcher, tlsCfg *tls.Config, dialTimeout, failureWait time.Duration, log *slog.Logger, once *onceLog) []*endpoint {
	seen := map[string]bool{}
	var list []*endpoint
	for _, s := range urls {
		u, err := parseMemberURL(s)
		if err != nil {
			log.Log(ctx, once.level("malformed", s), "ignoring malformed member client URL", "url", s, "err", err)
			continue
		}
		key := u.String()
		if seen[key] {
			continue
		}
		seen[key] = true
		list = append(list, &endpoint{url: key, hostport: u.Host})
	}
	var wg sync.WaitGroup
	for _, e := range list {
		if self != nil && self.isSelf(ctx, e.hostport) {
			e.self = true
			log.Log(ctx, once.level("self", e.url), "member client URL is this proxy's own address; not forwarding to it (loop)", "endpoint", e.url)
			continue
		}
		wg.Go(func() {
			pctx, cancel := context.WithTimeout(ctx, max(dialTimeout, probeTimeout))
			defer cancel()
			addr, err := probeEtcd(pctx, e.url, tlsCfg)
			if err != nil {
				// From the answer, not the start: a probe that timed out
				// took longer than a short FailureWait.
				e.failedUntil = time.Now().Add(failureWait)
				e.lastErr = err.Error()
				e.unverified = true
				return
			}
			e.addr = addr
		})
	}
	wg.Wait()
	return list
}

// probeTimeout is the least time an endpoint gets to answer a probe.
const probeTimeout = 2 * time.Second

// probeEtcd asks the endpoint for etcd's Maintenance.Status and returns
// the address it connected to. An answer counts as etcd's when it is a
// status, or an error etcd itself sends (a permission or authentication
// refusal); a transport failure, a timeout, or an Unimplemented from
// another gRPC server does not.
func probeEtcd(ctx context.Context, rawURL string, tlsCfg *tls.Config) (string, error) {
	u, err := url.Parse(rawURL)
	if err != nil {
		return "", err
	}
	creds := insecure.NewCredentials()
	if u.Scheme == "https" {
		c := &tls.Config{MinVersion: tls.VersionTLS12}
		if tlsCfg != nil {
			c = tlsCfg.Clone()
		}
		if c.ServerName == "" {
			c.ServerName = u.Hostname()
		}
		creds = credentials.NewTLS(c)
	}
	var remote atomic.Value
	conn, err := grpc.NewClient("passthrough:///"+u.Host,
		grpc.WithTransportCredentials(creds),
		grpc.WithContextDialer(func(ctx context.Context, addr string) (net.Conn, error) {
			c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
			if err == nil {
				remote.Store(c.RemoteAddr().String())
			}
			return c, err
		}))
	if err != nil {
		return "", err
	}
	defer conn.Close()
	_, err = pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{})
	switch status.Code(err) {
	case codes.OK, codes.PermissionDenied, codes.Unauthenticated, codes.InvalidArgument, codes.FailedPrecondition:
		addr, _ := remote.Load().(string)
		return addr, nil
	case codes.Unimplemented:
		return "", fmt.Errorf("answers gRPC but is not etcd (%s)", status.Convert(err).Message())
	case codes.DeadlineExceeded:
		if remote.Load() != nil {
			return "", errors.New("accepted the connection but did not answer as etcd in time (is it etcd, and does its cluster have a leader?)")
		}
	}
	if err != nil && remote.Load() != nil {
		return "", fmt.Errorf("accepted the connection but did not answer as etcd: %s", status.Convert(err).Message())
	}
	return "", fmt.Errorf("unreachable: %s", status.Convert(err).Message())
}
