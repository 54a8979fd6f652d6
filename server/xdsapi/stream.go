package xdsapi

import (
	"context"
	"maps"
	"strconv"
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

// A stream is one ADS stream, state of the world. Its state is owned by
// the goroutine that runs it (run); the index reaches it only through
// notify, which never blocks. Per type it keeps what the client
// subscribes to, what was last sent, and whether that response awaits the
// client's ACK or NACK: Beacon sends one response per type at a time, and
// the next once the client has answered, so that a slow client gets the
// latest state rather than a queue of old ones.
type stream struct {
	srv    *Server
	ctx    context.Context
	send   func(*discoveryv3.DiscoveryResponse) error
	peer   string // client address, for logs and the per-client bound
	access Access // nil: every namespace is readable
	node   nodeInfo

	// dirty holds the types the index changed since run last looked;
	// wake is signalled with it.
	dirty atomicMask
	wake  chan struct{}

	types   map[string]*typeState // by type URL
	nonce   uint64
	visible map[string]bool // namespaces the access was asked about
	retry   *time.Timer     // a visibility check to retry (nil: none)
	ackWait *time.Timer     // armed while a response awaits its ACK
}

// nodeInfo is who the client says it is (its first request's node).
type nodeInfo struct {
	id, cluster string
	client      string // user agent, as a metrics label
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
	// nonce of the response awaiting the client's answer ("" if none),
	// and when it was sent.
	awaiting string
	sentAt   time.Time
}

// notify tells the stream that resources of the types in m changed.
func (s *stream) notify(m typeMask) {
	s.dirty.or(m)
	select {
	case s.wake <- struct{}{}:
	default:
	}
}

// handle applies one request: an ACK or NACK of the last response of its
// type, and the client's subscription.
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
		if n != ts.awaiting {
			return nil // about an older response: ignored, as the protocol says
		}
		ts.awaiting = ""
		if d := req.GetErrorDetail(); d != nil {
			s.srv.nacked(s, ts, req)
		}
	}
	return s.subscribe(ts, req.GetResourceNames())
}

// subscribe sets what the client follows of a type to names.
func (s *stream) subscribe(ts *typeState, names []string) error {
	if len(names) > s.srv.cfg.MaxNamesPerStream {
		return status.Errorf(codes.ResourceExhausted, "%d resource names of type %s in one request: at most %d per stream (subscribe with no names, the wildcard, to get every service)",
			len(names), ts.url, s.srv.cfg.MaxNamesPerStream)
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
			s.resubscribe(ts.t, st)
		}
	}
	for n := range want {
		if _, ok := ts.names[n]; ok {
			continue
		}
		var st *svcState
		if svc, _, ok := parseName(n); ok && ts.t < numTypes {
			st = s.srv.idx.subscribe(s, svc, s.maskFor(svc)|ts.t.mask())
		}
		ts.names[n] = st
	}
	return nil
}

// maskFor returns the types under which the stream subscribes to svc.
func (s *stream) maskFor(svc service) typeMask {
	var m typeMask
	for _, ts := range s.types {
		if ts.t == numTypes {
			continue
		}
		for _, st := range ts.names {
			if st != nil && st.svc == svc {
				m |= ts.t.mask()
				break
			}
		}
	}
	return m
}

// resubscribe updates the index after the stream dropped a name of type t
// that designated st.
func (s *stream) resubscribe(t rtype, st *svcState) {
	if st == nil || t == numTypes {
		return
	}
	s.srv.idx.subscribe(s, st.svc, s.maskFor(st.svc))
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

// flush sends, for each type, the response the client is owed, unless one
// still awaits its answer. It fails the stream when a response has waited
// past AckTimeout while newer state is held back.
func (s *stream) flush() error {
	dirty := s.dirty.take()
	for _, ts := range s.types {
		if ts.t < numTypes && dirty&ts.t.mask() != 0 {
			ts.pending = true
		}
	}
	if !s.srv.idx.isReady() {
		return nil // nothing is sent before the registry's first snapshot
	}
	if ok, err := s.ensureVisible(); err != nil || !ok {
		return err // a permission check failed: retried, nothing partial sent
	}
	now := time.Now()
	var firstWait time.Time
	for _, ts := range s.types {
		if !ts.pending && !ts.changed {
			continue
		}
		if ts.awaiting != "" {
			if now.Sub(ts.sentAt) > s.srv.cfg.AckTimeout {
				return status.Errorf(codes.DeadlineExceeded,
					"the client answered no response of type %s for %v (nonce %s) while newer state waited: Beacon sends one response per type and waits for its ACK or NACK",
					ts.url, s.srv.cfg.AckTimeout, ts.awaiting)
			}
			if firstWait.IsZero() || ts.sentAt.Before(firstWait) {
				firstWait = ts.sentAt
			}
			continue
		}
		if err := s.respond(ts, now); err != nil {
			return err
		}
	}
	if !firstWait.IsZero() {
		s.armAckWait(firstWait.Add(s.srv.cfg.AckTimeout).Sub(now))
	}
	return nil
}

// armAckWait wakes the stream after d, to check the ACK deadline.
func (s *stream) armAckWait(d time.Duration) {
	if s.ackWait == nil {
		s.ackWait = time.NewTimer(d)
		return
	}
	s.ackWait.Reset(d)
}

// respond builds and sends the response of one type, if the client is owed
// one.
func (s *stream) respond(ts *typeState, now time.Time) error {
	res, sent, version, ok := s.build(ts)
	ts.pending, ts.changed = false, false
	if !ok {
		return nil
	}
	s.nonce++
	nonce := strconv.FormatUint(s.nonce, 10)
	resp := &discoveryv3.DiscoveryResponse{
		VersionInfo: strconv.FormatUint(version, 10),
		Resources:   res,
		TypeUrl:     ts.url,
		Nonce:       nonce,
	}
	if err := s.send(resp); err != nil {
		return err
	}
	ts.sent, ts.awaiting, ts.sentAt = sent, nonce, now
	s.srv.m.sent(ts.t, len(res))
	return nil
}

// build returns the response a type is owed: for Listener and Cluster
// every resource subscribed to that exists (sent when that set or a
// version in it changed, or the subscription did); for assignments those
// whose version the client has not seen yet. ok is false when there is
// nothing to send.
func (s *stream) build(ts *typeState) (res []*anypb.Any, sent map[string]uint64, version uint64, ok bool) {
	x := s.srv.idx
	x.mu.RLock()
	defer x.mu.RUnlock()
	version = x.gen
	if ts.t == numTypes {
		return nil, ts.sent, version, ts.changed
	}
	add := func(name string, st *svcState) {
		if st == nil || !s.visible[st.svc.ns] {
			return
		}
		r := st.resourceFor(ts.t, name)
		if !ts.t.fullState() {
			if v, seen := ts.sent[name]; seen && v == r.version {
				return
			}
		}
		res = append(res, r.any)
		if sent == nil {
			sent = map[string]uint64{}
		}
		sent[name] = r.version
	}
	for name, st := range ts.names {
		add(name, st)
	}
	if ts.wildcard {
		for svc, st := range x.services {
			name := svc.dnsName()
			if _, named := ts.names[name]; st.present() && !named {
				add(name, st)
			}
		}
	}
	if ts.t.fullState() {
		return res, sent, version, ts.changed || !maps.Equal(sent, ts.sent)
	}
	merged := maps.Clone(ts.sent)
	maps.Copy(merged, sent)
	return res, merged, version, len(res) > 0
}

// ensureVisible asks the access about every namespace the stream's
// subscriptions reach that it has not asked about yet. It reports false
// when a check failed (etcd unreachable): the stream then sends nothing
// and tries again shortly, rather than answer "does not exist" for
// resources it may well read. An Unauthenticated or PermissionDenied
// status (the credentials no longer work) is returned: it ends the stream.
func (s *stream) ensureVisible() (bool, error) {
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
	x.mu.RUnlock()
	for _, ns := range ask {
		if s.access == nil {
			s.visible[ns] = true
			continue
		}
		ctx, cancel := context.WithTimeout(s.ctx, permissionTimeout)
		ok, err := s.access.Readable(ctx, ns)
		cancel()
		if c := status.Code(err); c == codes.Unauthenticated || c == codes.PermissionDenied {
			return false, err
		}
		if err != nil {
			s.srv.log.Warn("xds: cannot check a client's permission to read a namespace; retrying",
				"namespace", ns, "node", s.node.id, "peer", s.peer, "err", err)
			s.retryIn(permissionRetry)
			return false, nil
		}
		s.visible[ns] = ok
		if !ok {
			s.srv.m.denied.Inc()
		}
	}
	return true, nil
}

// Permission checks are bounded, and retried after a failure.
const (
	permissionTimeout = 5 * time.Second
	permissionRetry   = time.Second
)

func (s *stream) retryIn(d time.Duration) {
	if s.retry == nil {
		s.retry = time.NewTimer(d)
		return
	}
	s.retry.Reset(d)
}

// timerC returns t's channel, or nil (never ready) for no timer.
func timerC(t *time.Timer) <-chan time.Time {
	if t == nil {
		return nil
	}
	return t.C
}

func (s *stream) stopTimers() {
	for _, t := range []*time.Timer{s.retry, s.ackWait} {
		if t != nil {
			t.Stop()
		}
	}
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
