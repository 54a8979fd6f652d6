package xdsapi

import (
	"context"
	"maps"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/anypb"
)

// wildcardName is the explicit wildcard subscription.
const wildcardName = "*"

// maxTypesPerStream bounds the distinct type URLs one stream may ask for
// (Beacon serves three; the others are answered empty).
const maxTypesPerStream = 16

// A stream is one ADS stream, state of the world. Two goroutines serve
// it: the receiving one applies the client's requests (handle), the
// sending one builds and sends responses (prepare, then send), woken by the
// index (notify, which never blocks) or by the receiving one when an ACK
// makes a response due. Per type the stream keeps what the client
// subscribes to, what was last sent, and whether that response awaits the
// client's ACK or NACK: Beacon sends one response per type at a time, and
// the next once the client has answered, so that a slow client gets the
// latest state rather than a queue of old ones.
//
// Lock order: stream.mu, then index.mu.
type stream struct {
	srv  *Server
	ctx  context.Context
	send func(*discoveryv3.DiscoveryResponse) error
	// sendingSince is when the send under way began (UnixNano; 0: none):
	// the handler ends a stream whose client does not read (watchSends).
	sendingSince atomic.Int64
	peer         string // client address, for logs and the per-client bound
	access       Access // nil: every namespace is readable

	// dirty holds the types the index changed since the sending goroutine
	// last looked; wake is signalled with it.
	dirty atomicMask
	wake  chan struct{}

	// visible caches the access's answers, per namespace, asked again
	// after checkedAt+PermissionRecheck; the sending goroutine alone uses
	// them.
	visible   map[string]bool
	checkedAt time.Time

	mu    sync.Mutex
	node  nodeInfo
	types map[string]*typeState // by type URL
	// refs counts, per service and type, the subscribed names that
	// designate it (a service has several names): the types under which
	// the index has the stream follow it, kept as names come and go so
	// that a request of n names costs O(n), not O(n²).
	refs  map[service]*[numTypes]int
	names int // subscribed, over all types (MaxNamesPerStream)
	nonce uint64
}

// nodeInfo is who the client says it is (its first request's node).
type nodeInfo struct {
	id, cluster string
	client      string    // user agent, as a metrics label
	refuses     policySet // load-balancing policies its implementation refuses
	seen        bool
}

// typeState is a stream's subscription to one type.
type typeState struct {
	url string
	t   rtype // numTypes for a type Beacon serves none of
	// wildcard is on for an empty first subscription (or "*"); explicit
	// once the client named resources (an empty list then means none).
	wildcard, explicit bool
	names              map[string]*svcState // subscribed names; nil state: no service
	// sent is, per resource name, the version last sent.
	sent map[string]uint64
	// changed is set when the subscription changed since the last
	// response: the client must hear about it even if nothing else did.
	changed bool
	// pending is set when the index changed something of this type.
	pending bool
	// lastNonce is the nonce of the last response sent; awaiting is it
	// while the client has not answered that response ("" once it has),
	// and sentAt when it was sent.
	lastNonce, awaiting string
	sentAt              time.Time
	// nackWarned is when a NACK of this type was last logged at WARN;
	// nacksQuiet counts those logged at DEBUG since.
	nackWarned time.Time
	nacksQuiet int
}

// sendTracked sends resp, noting for watchSends when it began.
func (s *stream) sendTracked(resp *discoveryv3.DiscoveryResponse) error {
	s.sendingSince.Store(time.Now().UnixNano())
	defer s.sendingSince.Store(0)
	return s.send(resp)
}

// notify tells the stream that resources of the types in m changed.
func (s *stream) notify(m typeMask) {
	s.dirty.or(m)
	s.kick()
}

// kick wakes the sending goroutine.
func (s *stream) kick() {
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// due reports whether a response is owed and may be sent now (none of its
// type awaits an answer). Called with mu held.
func (s *stream) due() bool {
	for _, ts := range s.types {
		if (ts.changed || ts.pending) && ts.awaiting == "" {
			return true
		}
	}
	return false
}

// handle applies one request: an ACK or NACK of the last response of its
// type, and the client's subscription. Called with mu held.
func (s *stream) handle(req *discoveryv3.DiscoveryRequest) error {
	if !s.node.seen {
		s.node = s.srv.nodeOf(req.GetNode())
	}
	url := req.GetTypeUrl()
	if url == "" {
		return status.Error(codes.InvalidArgument, "a request on the aggregated stream must name its type_url (e.g. "+ListenerType+")")
	}
	ts := s.types[url]
	if ts == nil {
		if len(s.types) >= maxTypesPerStream {
			return status.Errorf(codes.InvalidArgument, "more than %d resource types on one stream: Beacon serves %s, %s and %s", maxTypesPerStream, ListenerType, ClusterType, EndpointType)
		}
		t, known := typeOf(url)
		if !known {
			s.srv.m.unknownType.Inc()
			s.srv.log.Debug("xds: a client asks for a type Beacon serves none of; answering it empty",
				"type_url", truncate(url, 200), "node", s.node.id, "peer", s.peer)
		}
		// changed: the first request of a type is always answered.
		ts = &typeState{url: url, t: t, names: map[string]*svcState{}, sent: map[string]uint64{}, changed: true}
		s.types[url] = ts
	}
	if n := req.GetResponseNonce(); n != "" {
		if n != ts.lastNonce {
			return nil // about an older response: ignored, as the protocol says
		}
		// The answer to the last response, or (once it was answered) a
		// change of subscription, which names that response too.
		if ts.awaiting == n {
			ts.awaiting = ""
			if d := req.GetErrorDetail(); d != nil {
				s.srv.nacked(s, ts, req)
			}
		}
	}
	return s.subscribe(ts, req.GetResourceNames())
}

// subscribe sets what the client follows of a type to names.
func (s *stream) subscribe(ts *typeState, names []string) error {
	if len(names) > s.srv.cfg.MaxNamesPerStream {
		return s.tooManyNames(ts, len(names))
	}
	wildcard := false
	want := make(map[string]struct{}, len(names))
	for _, n := range names {
		if n == wildcardName {
			wildcard = true
			continue
		}
		want[n] = struct{}{}
	}
	delta := len(want) - len(ts.names)
	if s.names+delta > s.srv.cfg.MaxNamesPerStream {
		return s.tooManyNames(ts, s.names+delta)
	}
	if err := s.srv.reserveNames(s.peer, delta); err != nil {
		return err
	}
	s.names += delta
	if len(names) == 0 && !ts.explicit {
		wildcard = true // the legacy wildcard: an empty first subscription
	}
	if len(want) > 0 {
		ts.explicit = true
	}
	if wildcard != ts.wildcard || !sameKeys(want, ts.names) {
		ts.changed = true
	}
	if ts.t < numTypes && wildcard != ts.wildcard {
		s.srv.idx.setWildcard(s, ts.t, wildcard)
	}
	ts.wildcard = wildcard
	for n := range ts.names {
		if _, ok := want[n]; !ok {
			st := ts.names[n]
			delete(ts.names, n)
			delete(ts.sent, n)
			if st != nil {
				s.follow(st.svc, ts.t, -1)
			}
		}
	}
	for n := range want {
		if _, ok := ts.names[n]; ok {
			continue
		}
		var st *svcState
		if svc, _, ok := parseName(n, s.srv.readNames); ok && ts.t < numTypes {
			st = s.follow(svc, ts.t, +1)
		}
		ts.names[n] = st
	}
	return nil
}

// tooManyNames is the error of a request that would have the stream
// subscribe to n names.
func (s *stream) tooManyNames(ts *typeState, n int) error {
	s.srv.m.refused.WithLabelValues("max_names_per_stream").Inc()
	return status.Errorf(codes.ResourceExhausted, "a request of type %s would have this stream subscribe to %d resource names: at most %d per stream, over all types (subscribe with no names, the wildcard, to get every service)",
		ts.url, n, s.srv.cfg.MaxNamesPerStream)
}

// follow counts one more (delta +1) or one fewer (-1) name of type t
// designating svc, and has the index follow svc for the stream under the
// types that still have one; it returns svc's state (nil once none has).
func (s *stream) follow(svc service, t rtype, delta int) *svcState {
	c := s.refs[svc]
	if c == nil {
		c = new([numTypes]int)
		s.refs[svc] = c
	}
	c[t] += delta
	var m typeMask
	for t, n := range c {
		if n > 0 {
			m |= rtype(t).mask()
		}
	}
	if m == 0 {
		delete(s.refs, svc)
	}
	return s.srv.idx.subscribe(s, svc, m)
}

// subscribed returns every service the stream subscribes to.
func (s *stream) subscribed() []*svcState {
	var out []*svcState
	for _, ts := range s.types {
		for _, st := range ts.names {
			if st != nil {
				out = append(out, st)
			}
		}
	}
	return out
}

// next says when the sending goroutine must look at the stream again
// without being woken: to retry a permission check, or to enforce the ACK
// deadline (zero: no need).
type next struct{ retry, ackCheck time.Duration }

// prepare returns the responses the client is owed, one per type at most,
// and records them as sent (they are sent next, without the lock; a failed
// send ends the stream). It fails the stream when a response has waited
// past AckTimeout while newer state is held back. Nothing is sent before
// the registry's first snapshot, nor while a permission check fails.
func (s *stream) prepare(now time.Time) ([]*discoveryv3.DiscoveryResponse, next, error) {
	if !s.srv.idx.isReady() {
		return nil, next{}, nil
	}
	var wait next
	if s.access != nil {
		if ok, err := s.refreshVisible(now); err != nil || !ok {
			return nil, next{retry: permissionRetry}, err
		}
		wait.retry = s.srv.cfg.PermissionRecheck - now.Sub(s.checkedAt)
	}
	s.mu.Lock()
	defer s.mu.Unlock()
	dirty := s.dirty.take()
	var out []*discoveryv3.DiscoveryResponse
	for _, ts := range s.types {
		if ts.t < numTypes && dirty&ts.t.mask() != 0 {
			ts.pending = true
		}
		if !ts.pending && !ts.changed {
			continue
		}
		if ts.awaiting != "" {
			left := s.srv.cfg.AckTimeout - now.Sub(ts.sentAt)
			if left < 0 {
				return nil, next{}, status.Errorf(codes.DeadlineExceeded,
					"the client answered no response of type %s for %v (nonce %s) while newer state waited: Beacon sends one response per type and waits for its ACK or NACK",
					ts.url, s.srv.cfg.AckTimeout, ts.awaiting)
			}
			if wait.ackCheck == 0 || left < wait.ackCheck {
				wait.ackCheck = left
			}
			continue
		}
		if resp := s.respond(ts, now); resp != nil {
			out = append(out, resp)
		}
	}
	return out, wait, nil
}

// respond returns the response of one type, if the client is owed one,
// and records it as sent. Called with mu held.
func (s *stream) respond(ts *typeState, now time.Time) *discoveryv3.DiscoveryResponse {
	res, version, ok := s.build(ts)
	ts.pending, ts.changed = false, false
	if !ok {
		return nil
	}
	s.nonce++
	nonce := strconv.FormatUint(s.nonce, 10)
	ts.lastNonce, ts.awaiting, ts.sentAt = nonce, nonce, now
	return &discoveryv3.DiscoveryResponse{
		VersionInfo: strconv.FormatUint(version, 10),
		Resources:   res,
		TypeUrl:     ts.url,
		Nonce:       nonce,
	}
}

// build returns the resources a type is owed, and records what it sends in
// ts.sent: for Listener and Cluster every resource subscribed to that
// exists (owed when that set or a version in it changed, or the
// subscription did); for assignments those whose version the client has
// not seen yet. ok is false when nothing is owed.
func (s *stream) build(ts *typeState) (res []*anypb.Any, version uint64, ok bool) {
	x := s.srv.idx
	x.mu.RLock()
	defer x.mu.RUnlock()
	version = x.gen
	if ts.t == numTypes {
		return nil, version, ts.changed
	}
	full := ts.t.fullState()
	var sent map[string]uint64 // full state: the new set
	if full {
		sent = make(map[string]uint64, len(ts.sent))
	}
	add := func(name string, st *svcState) {
		if st == nil || !s.readable(st.svc.ns) {
			return
		}
		r := st.resourceFor(ts.t, name, s.node.refuses)
		if full {
			sent[name] = r.version
		} else if v, seen := ts.sent[name]; seen && v == r.version {
			return
		} else {
			ts.sent[name] = r.version
		}
		res = append(res, r.any)
	}
	// In name order, so that a response lists its resources the same way
	// every time (they come from maps).
	type subscribed struct {
		name string
		st   *svcState
	}
	var all []subscribed
	for name, st := range ts.names {
		all = append(all, subscribed{name, st})
	}
	if ts.wildcard {
		for svc, st := range x.services {
			name := svc.dnsName()
			if _, named := ts.names[name]; st.present() && !named {
				all = append(all, subscribed{name, st})
			}
		}
	}
	slices.SortFunc(all, func(a, b subscribed) int { return strings.Compare(a.name, b.name) })
	for _, sub := range all {
		add(sub.name, sub.st)
	}
	if !full {
		return res, version, len(res) > 0
	}
	owed := ts.changed || !maps.Equal(sent, ts.sent)
	ts.sent = sent
	return res, version, owed
}

// readable reports whether the client may read a namespace (every one
// without an access).
func (s *stream) readable(ns string) bool { return s.access == nil || s.visible[ns] }

// unknownNamespaces returns the namespaces the subscriptions reach that
// the access was not asked about yet. Called with mu held.
func (s *stream) unknownNamespaces() []string {
	var ask []string
	seen := map[string]bool{}
	need := func(ns string) {
		if _, known := s.visible[ns]; !known && !seen[ns] {
			seen[ns] = true
			ask = append(ask, ns)
		}
	}
	x := s.srv.idx
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, ts := range s.types {
		for _, st := range ts.names {
			if st != nil {
				need(st.svc.ns)
			}
		}
		if ts.wildcard {
			for svc, st := range x.services {
				if st.present() {
					need(svc.ns)
				}
			}
		}
	}
	return ask
}

// refreshVisible asks the access about the namespaces the subscriptions
// reach that it was not asked about, and about every one once its answer is
// PermissionRecheck old (a role granted or revoked applies then); an answer
// that changed makes every type owed again. It reports false when a check
// failed (etcd unreachable): the stream then sends nothing and tries again
// shortly, rather than answer "does not exist" for resources it may well
// read. An Unauthenticated or PermissionDenied status (the credentials no
// longer work) is returned: it ends the stream.
func (s *stream) refreshVisible(now time.Time) (bool, error) {
	s.mu.Lock()
	ask := s.unknownNamespaces()
	s.mu.Unlock()
	recheck := now.Sub(s.checkedAt) >= s.srv.cfg.PermissionRecheck
	if recheck {
		for ns := range s.visible {
			ask = append(ask, ns)
		}
	}
	answers := make(map[string]bool, len(ask))
	for _, ns := range ask {
		ctx, cancel := context.WithTimeout(s.ctx, permissionTimeout)
		ok, err := s.access.Readable(ctx, ns)
		cancel()
		if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
			return false, err
		}
		if err != nil {
			s.srv.log.Warn("xds: cannot check a client's permission to read a namespace; retrying",
				"namespace", ns, "node", s.nodeID(), "peer", s.peer, "err", err)
			return false, nil
		}
		answers[ns] = ok
	}
	changed := false
	for ns, ok := range answers {
		if old, known := s.visible[ns]; known && old != ok {
			changed = true
		}
		if !ok && !recheck {
			s.srv.m.denied.Inc()
		}
		s.visible[ns] = ok
	}
	if recheck {
		s.checkedAt = now
	}
	if changed {
		s.mu.Lock()
		for _, ts := range s.types {
			ts.changed = true
		}
		s.mu.Unlock()
	}
	return true, nil
}

// nodeID is the client's node ID, for logs.
func (s *stream) nodeID() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.node.id
}

// Permission checks are bounded, and retried after a failure.
const (
	permissionTimeout = 5 * time.Second
	permissionRetry   = time.Second
)

// timerC returns t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

// sameKeys reports whether a set of names equals the keys of a
// subscription.
func sameKeys(want map[string]struct{}, have map[string]*svcState) bool {
	if len(want) != len(have) {
		return false
	}
	for n := range want {
		if _, ok := have[n]; !ok {
			return false
		}
	}
	return true
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "…"
}

// atomicMask is a typeMask that the index sets and the stream takes.
type atomicMask struct{ v atomic.Uint32 }

func (m *atomicMask) or(t typeMask) { m.v.Or(uint32(t)) }

func (m *atomicMask) take() typeMask { return typeMask(m.v.Swap(0)) }
