package registryapi

import (
	"context"
	"fmt"
	"math"
	"net"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
)

// Defaults of Limits.
const (
	DefaultMaxWatches                = 4096
	DefaultMaxWatchesPerClient       = 128
	DefaultMaxRegistrations          = 100_000
	DefaultMaxRegistrationsPerClient = 1000
	// DefaultMaxTokenCreationsPerClient and DefaultMaxTokenCreations are
	// discovery tokens created per minute (POST /v1/tokens and v2
	// discovery's /new), by one client and in all.
	DefaultMaxTokenCreationsPerClient = 60
	DefaultMaxTokenCreations          = 600
	// watchRetryAfter is the Retry-After of a refused watch stream.
	watchRetryAfter = 5 * time.Second
)

// Limits bound what clients hold through one API server: open watch
// streams, and live registrations (from registration until the lease's TTL
// runs out without a heartbeat, or deregistration). A request over a limit
// gets 429 resource_exhausted with Retry-After. The counts are this
// server's: several `beacon serve` fronts of one cluster count separately.
//
// For each field, zero means the default above and a negative value means
// no limit.
type Limits struct {
	MaxWatches                int
	MaxWatchesPerClient       int
	MaxRegistrations          int
	MaxRegistrationsPerClient int
	// MaxTokenCreationsPerClient and MaxTokenCreations bound discovery
	// tokens created per minute (CreateTokenAllowed), by one client and
	// in all; each is also the burst allowed at once.
	MaxTokenCreationsPerClient int
	MaxTokenCreations          int
	// Client names the client a request counts against: the
	// authenticated user, for example. Nil (or an empty name) means the
	// remote IP address.
	Client func(*http.Request) string
}

func limit(v, def int) int {
	switch {
	case v == 0:
		return def
	case v < 0:
		return math.MaxInt
	}
	return v
}

// quota counts watch streams and registrations.
type quota struct {
	name                         func(*http.Request) string
	maxWatches, maxWatchesClient int
	maxRegs, maxRegsClient       int
	now                          func() time.Time

	mu       sync.Mutex
	watches  map[string]int
	nWatches int
	regs     map[string]map[string]time.Time // client → ref → expiry
	owner    map[string]string               // ref → client
	pending  map[string]int                  // client → registrations in flight
	nRegs    int                             // entries in regs, expired or not, plus pending

	maxCreates, maxCreatesClient int
	creates                      map[string]*bucket // client → its token creations
	allCreates                   bucket
	swept                        time.Time // when full buckets were last forgotten
}

// bucket is a token bucket refilled at n per minute up to n.
type bucket struct {
	left float64
	at   time.Time
}

// take spends one unit of b, or returns how long until one is there.
func (b *bucket) take(n int, now time.Time) (bool, time.Duration) {
	if n == math.MaxInt {
		return true, 0
	}
	perSec := float64(n) / 60
	if b.at.IsZero() {
		b.left = float64(n)
	} else {
		b.left = math.Min(float64(n), b.left+now.Sub(b.at).Seconds()*perSec)
	}
	b.at = now
	if b.left < 1 {
		return false, time.Duration((1 - b.left) / perSec * float64(time.Second))
	}
	b.left--
	return true, 0
}

// allowCreate spends one token creation of client and of the server, or
// answers 429 with Retry-After.
func (q *quota) allowCreate(w http.ResponseWriter, client string) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	if now.Sub(q.swept) > time.Minute {
		// A bucket untouched for a minute is full again: forget it.
		for c, b := range q.creates {
			if now.Sub(b.at) > time.Minute {
				delete(q.creates, c)
			}
		}
		q.swept = now
	}
	b := q.creates[client]
	if b == nil {
		b = &bucket{}
	}
	saved, savedAll := *b, q.allCreates
	if ok, wait := b.take(q.maxCreatesClient, now); !ok {
		*b = saved
		tooMany(w, wait, fmt.Sprintf("client %s created %d discovery tokens within the last minute, the most one client may (a token bootstraps one whole cluster)", client, q.maxCreatesClient))
		return false
	}
	if ok, wait := q.allCreates.take(q.maxCreates, now); !ok {
		*b, q.allCreates = saved, savedAll
		tooMany(w, wait, fmt.Sprintf("this server created %d discovery tokens within the last minute, its limit: retry later", q.maxCreates))
		return false
	}
	q.creates[client] = b
	return true
}

// CreateTokenAllowed counts the creation of a discovery token by r's
// client (POST /v1/tokens, v2 discovery's /new) against the per-minute
// caps of the client and of the server (Limits.MaxTokenCreationsPerClient,
// Limits.MaxTokenCreations), or answers 429 with Retry-After and returns
// false.
func (h *Handler) CreateTokenAllowed(w http.ResponseWriter, r *http.Request) bool {
	return h.quota.allowCreate(w, h.quota.client(r))
}

func newQuota(l Limits) (*quota, error) {
	return &quota{
		name:             l.Client,
		maxWatches:       limit(l.MaxWatches, DefaultMaxWatches),
		maxWatchesClient: limit(l.MaxWatchesPerClient, DefaultMaxWatchesPerClient),
		maxRegs:          limit(l.MaxRegistrations, DefaultMaxRegistrations),
		maxRegsClient:    limit(l.MaxRegistrationsPerClient, DefaultMaxRegistrationsPerClient),
		now:              time.Now,
		watches:          map[string]int{},
		regs:             map[string]map[string]time.Time{},
		owner:            map[string]string{},
		pending:          map[string]int{},
		maxCreates:       limit(l.MaxTokenCreations, DefaultMaxTokenCreations),
		maxCreatesClient: limit(l.MaxTokenCreationsPerClient, DefaultMaxTokenCreationsPerClient),
		creates:          map[string]*bucket{},
	}, nil
}

// client names the request's client.
func (q *quota) client(r *http.Request) string {
	if q.name != nil {
		if n := q.name(r); n != "" {
			return n
		}
	}
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		return r.RemoteAddr
	}
	return host
}

func tooMany(w http.ResponseWriter, retry time.Duration, msg string) {
	secs := max(1, int(math.Ceil(retry.Seconds())))
	w.Header().Set("Retry-After", strconv.Itoa(secs))
	writeError(w, http.StatusTooManyRequests, "resource_exhausted", fmt.Sprintf("%s; retry in %d s", msg, secs))
}

// acquireWatch counts a watch stream of client, or answers 429.
func (q *quota) acquireWatch(w http.ResponseWriter, client string) (release func(), ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	switch {
	case q.watches[client] >= q.maxWatchesClient:
		tooMany(w, watchRetryAfter, fmt.Sprintf("client %s has %d watch streams (and v2 discovery waits) open on this server, the most one client may hold: close some (one stream can watch a whole namespace)", client, q.watches[client]))
		return nil, false
	case q.nWatches >= q.maxWatches:
		tooMany(w, watchRetryAfter, fmt.Sprintf("this server holds %d watch streams, its limit: use another server of the cluster or retry later", q.nWatches))
		return nil, false
	}
	q.watches[client]++
	q.nWatches++
	var once sync.Once
	return func() {
		once.Do(func() {
			q.mu.Lock()
			defer q.mu.Unlock()
			q.nWatches--
			if q.watches[client]--; q.watches[client] <= 0 {
				delete(q.watches, client)
			}
		})
	}, true
}

// HoldStream counts a long-lived request of r's client other than a
// watch stream of this API (a v2 discovery long poll, say) against the
// same caps as watch streams, or answers 429 with Retry-After and
// returns false. Call release when the request ends.
func (h *Handler) HoldStream(w http.ResponseWriter, r *http.Request) (release func(), ok bool) {
	return h.quota.acquireWatch(w, h.quota.client(r))
}

// regSlot is a registration in flight.
type regSlot struct {
	q      *quota
	client string
	done   bool
}

// pruneLocked forgets the registrations of client whose TTL ran out, and
// returns the earliest expiry of the rest.
func (q *quota) pruneLocked(client string, now time.Time) time.Time {
	var first time.Time
	for ref, exp := range q.regs[client] {
		if !exp.After(now) {
			delete(q.regs[client], ref)
			delete(q.owner, ref)
			q.nRegs--
			continue
		}
		if first.IsZero() || exp.Before(first) {
			first = exp
		}
	}
	if len(q.regs[client]) == 0 {
		delete(q.regs, client)
	}
	return first
}

// reserveRegistration counts a registration in flight, or answers 429.
func (q *quota) reserveRegistration(w http.ResponseWriter, client string) (*regSlot, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.now()
	first := q.pruneLocked(client, now)
	if n := len(q.regs[client]) + q.pending[client]; n >= q.maxRegsClient {
		tooMany(w, first.Sub(now), fmt.Sprintf("client %s holds %d live registrations on this server, the most one client may hold: deregister some, or let them expire", client, n))
		return nil, false
	}
	if q.nRegs >= q.maxRegs {
		var earliest time.Time
		for c := range q.regs {
			if f := q.pruneLocked(c, now); !f.IsZero() && (earliest.IsZero() || f.Before(earliest)) {
				earliest = f
			}
		}
		if q.nRegs >= q.maxRegs {
			tooMany(w, earliest.Sub(now), fmt.Sprintf("this server holds %d live registrations, its limit: use another server of the cluster or retry later", q.nRegs))
			return nil, false
		}
	}
	q.pending[client]++
	q.nRegs++
	return &regSlot{q: q, client: client}, true
}

func (s *regSlot) end(q *quota) {
	s.done = true
	if q.pending[s.client]--; q.pending[s.client] <= 0 {
		delete(q.pending, s.client)
	}
	q.nRegs--
}

// cancel forgets a registration that failed.
func (s *regSlot) cancel() {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if !s.done {
		s.end(q)
	}
}

// commit records a registration that succeeded.
func (s *regSlot) commit(ref beacon.Ref, ttl time.Duration) {
	q := s.q
	q.mu.Lock()
	defer q.mu.Unlock()
	if s.done {
		return
	}
	s.end(q)
	key := ref.String()
	if prev, ok := q.owner[key]; ok { // re-registered after expiry
		delete(q.regs[prev], key)
		q.nRegs--
	}
	if q.regs[s.client] == nil {
		q.regs[s.client] = map[string]time.Time{}
	}
	q.regs[s.client][key] = q.now().Add(ttl)
	q.owner[key] = s.client
	q.nRegs++
}

// renewRegistration extends a registration after a heartbeat.
func (q *quota) renewRegistration(ref beacon.Ref, ttl time.Duration) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := ref.String()
	if c, ok := q.owner[key]; ok {
		q.regs[c][key] = q.now().Add(ttl)
	}
}

// releaseRegistration forgets a deregistered registration.
func (q *quota) releaseRegistration(ref beacon.Ref) {
	q.mu.Lock()
	defer q.mu.Unlock()
	key := ref.String()
	if c, ok := q.owner[key]; ok {
		delete(q.regs[c], key)
		if len(q.regs[c]) == 0 {
			delete(q.regs, c)
		}
		delete(q.owner, key)
		q.nRegs--
	}
}

// writeUnauthenticated answers 401 with the challenge of the schemes the
// server accepts.
func writeUnauthenticated(w http.ResponseWriter, err error) {
	w.Header().Set("WWW-Authenticate", `Basic realm="beacon", charset="UTF-8"`)
	w.Header().Add("WWW-Authenticate", `Bearer realm="beacon"`)
	msg := err.Error()
	if !strings.Contains(msg, "authenticat") {
		msg = "authentication failed: " + msg
	}
	writeError(w, http.StatusUnauthorized, "unauthenticated",
		msg+": send the etcd user's name and password (HTTP Basic) or an etcd token (Authorization: Bearer), and authenticate again if the token expired")
}

// permissionMessage says which permission the request lacked; who is the
// client (`user "alice"`), ns the namespace ("" for the path's or query's).
func permissionMessage(r *http.Request, who, ns string, err error) string {
	if ns == "" {
		ns = r.PathValue("namespace")
	}
	if ns == "" {
		ns = r.URL.Query().Get("namespace")
	}
	where := "every namespace (the whole registry)"
	if ns != "" {
		where = fmt.Sprintf("namespace %q", ns)
	}
	what, grant := writeAction(r), "readwrite on its instance prefix and its ownership-record prefix"
	if r.Method == http.MethodGet || r.Method == http.MethodHead {
		what, grant = "read", "read on its instance prefix"
	}
	if !strings.HasPrefix(who, "user ") {
		who = "the etcd user"
	}
	return fmt.Sprintf("permission denied: %s may not %s %s: grant it a role with %s (`beacon auth grant-namespace` grants both) (%v)",
		who, what, where, grant, err)
}

// writeAction names what a writing request of the registry API does, for
// a permission error ("may not <action> namespace ...").
func writeAction(r *http.Request) string {
	switch {
	case r.Method == http.MethodPatch:
		return "update instances in"
	case r.Method == http.MethodDelete:
		return "deregister instances in"
	case strings.HasSuffix(r.URL.Path, "/heartbeat"):
		return "renew (heartbeat) instances in"
	default:
		return "register in"
	}
}

// nsKey carries the namespace of a request whose namespace is in its body
// (registration), for error messages.
type nsKey struct{}

func withNamespace(r *http.Request, ns string) *http.Request {
	return r.WithContext(context.WithValue(r.Context(), nsKey{}, ns))
}

func namespaceOf(r *http.Request) string {
	ns, _ := r.Context().Value(nsKey{}).(string)
	return ns
}
