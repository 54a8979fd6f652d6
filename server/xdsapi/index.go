package xdsapi

import (
	"bytes"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	clusterv3 "github.com/envoyproxy/go-control-plane/envoy/config/cluster/v3"
	"google.golang.org/protobuf/types/known/anypb"
)

// rtype is a resource type Beacon serves.
type rtype uint8

const (
	tListener rtype = iota
	tCluster
	tEndpoint
	numTypes
)

// typeMask is a set of rtypes.
type typeMask uint32

func (t rtype) mask() typeMask { return 1 << t }

var typeURLs = [numTypes]string{ListenerType, ClusterType, EndpointType}

// typeNames label metrics.
var typeNames = [numTypes]string{"listener", "cluster", "endpoint"}

// typeOf returns the rtype of a type URL; ok is false for types Beacon
// serves none of.
func typeOf(url string) (rtype, bool) {
	i := slices.Index(typeURLs[:], url)
	if i < 0 {
		return numTypes, false
	}
	return rtype(i), true
}

// fullState reports whether a response of type t must hold every resource
// the client subscribes to, absence meaning "does not exist" (Listener and
// Cluster); of the others only what changed is sent.
func (t rtype) fullState() bool { return t == tListener || t == tCluster }

// resource is one marshalled resource, shared by every stream that sends
// it, and the index generation at which its bytes last changed.
type resource struct {
	any     *anypb.Any
	version uint64
}

// svcState is one service in the index: its instances and its resources,
// built once per change for every stream.
type svcState struct {
	svc       service
	instances map[string]beacon.Instance // by ID
	// listeners are named dnsName and slashName; cluster and assignment
	// dnsName. The listeners never change.
	listener, slashListener *resource
	cluster, assignment     *resource
	// roundRobin is the cluster with the default policy, for clients
	// known to refuse the service's (nil while that is the default).
	roundRobin *resource
	omitted    []omission
	policy     clusterv3.Cluster_LbPolicy
	// listed is whether the service was present when it was last
	// rebuilt, i.e. in wildcard answers.
	listed bool
	// subs holds the streams that subscribe to one of its names, and to
	// which types.
	subs map[*stream]typeMask
}

// present reports whether the registry holds instances of the service:
// wildcard subscriptions list only such services. Any service a client
// names explicitly exists for it, with an empty assignment until an
// instance registers.
func (s *svcState) present() bool { return len(s.instances) > 0 }

// resourceFor returns the resource of type t that name (one of the
// service's names) designates.
// A client that refuses the service's policy (refuses) gets its cluster
// with the default policy.
func (s *svcState) resourceFor(t rtype, name string, refuses policySet) *resource {
	switch t {
	case tListener:
		if name == s.svc.slashName() {
			return s.slashListener
		}
		return s.listener
	case tCluster:
		if s.roundRobin != nil && refuses.has(s.policy) {
			return s.roundRobin
		}
		return s.cluster
	default:
		return s.assignment
	}
}

// index is the registry as xDS resources: every service the registry holds
// or a client names, with its resources marshalled once per change, and
// who subscribes to what. Streams read it under its read lock and are
// told of changes through stream.notify, which never blocks.
type index struct {
	m *metrics

	mu       sync.RWMutex
	gen      uint64      // raised by every batch that changes a resource
	ready    atomic.Bool // the registry's first snapshot is in (read without mu)
	services map[service]*svcState
	// wild holds, per type, the streams with a wildcard subscription.
	wild    [numTypes]map[*stream]struct{}
	streams map[*stream]struct{}
	omitted map[string]int // current omissions by reason, over every service
	// stale is when the registry watch lost its store (zero while live);
	// the index keeps serving what it last knew.
	staleSince time.Time
	staleErr   error
	// updated is closed, and replaced, at every batch applied.
	updated chan struct{}
}

func newIndex(m *metrics) *index {
	x := &index{m: m, services: map[service]*svcState{}, streams: map[*stream]struct{}{}, omitted: map[string]int{}, updated: make(chan struct{})}
	for t := range x.wild {
		x.wild[t] = map[*stream]struct{}{}
	}
	return x
}

// newService returns the service's state with its listeners and an empty
// cluster and assignment, at generation gen.
func (x *index) newService(svc service) *svcState {
	name := svc.dnsName()
	x.m.marshalled(tListener, 2)
	x.m.marshalled(tCluster, 1)
	x.m.marshalled(tEndpoint, 1)
	return &svcState{
		svc:           svc,
		instances:     map[string]beacon.Instance{},
		listener:      &resource{any: buildListener(name, name), version: x.gen},
		slashListener: &resource{any: buildListener(svc.slashName(), name), version: x.gen},
		cluster:       &resource{any: buildCluster(name, lbPolicies[0].policy), version: x.gen},
		assignment:    &resource{any: buildAssignment(name, nil), version: x.gen},
		subs:          map[*stream]typeMask{},
	}
}

// apply folds one registry batch into the index, rebuilds the resources of
// the services it touched and tells the streams that follow them. It
// returns the omissions that are new (for the log).
func (x *index) apply(b registry.Batch) []omission {
	x.mu.Lock()
	defer x.mu.Unlock()
	close(x.updated)
	x.updated = make(chan struct{})
	if b.Kind == registry.Stale {
		if x.staleSince.IsZero() {
			x.staleSince = time.Now()
		}
		x.staleErr = b.Err
		return nil
	}
	x.staleSince, x.staleErr = time.Time{}, nil
	x.gen++
	touched := map[service]*svcState{}
	if b.Kind == registry.Snapshot {
		for svc, st := range x.services {
			touched[svc] = st
			st.instances = map[string]beacon.Instance{}
		}
	}
	for _, e := range b.Events {
		svc := serviceOf(e.Instance)
		st := x.services[svc]
		if st == nil {
			if e.Type == beacon.Removed {
				continue
			}
			st = x.newService(svc)
			x.services[svc] = st
		}
		touched[svc] = st
		if e.Type == beacon.Removed {
			delete(st.instances, e.Instance.ID)
		} else {
			st.instances[e.Instance.ID] = e.Instance
		}
	}
	var fresh []omission
	for _, st := range touched {
		fresh = append(fresh, x.rebuild(st)...)
	}
	if !x.ready.Load() {
		x.ready.Store(true)
		for s := range x.streams {
			s.notify(1<<numTypes - 1)
		}
	}
	return fresh
}

// rebuild rebuilds a touched service's cluster and assignment, keeps the
// old ones where the bytes are the same, and notifies the streams that
// must hear of what changed. It returns the service's new omissions.
func (x *index) rebuild(st *svcState) []omission {
	wasListed := st.listed
	ins := make([]beacon.Instance, 0, len(st.instances))
	for _, in := range st.instances {
		ins = append(ins, in)
	}
	slices.SortFunc(ins, func(a, b beacon.Instance) int { return bytes.Compare([]byte(a.ID), []byte(b.ID)) })
	policy, badPolicy := choosePolicy(ins)
	eps, om := endpoints(ins)
	om = append(om, badPolicy...)
	name := st.svc.dnsName()
	var changed typeMask
	if policy != st.policy {
		st.policy = policy
		st.cluster = &resource{any: buildCluster(name, policy), version: x.gen}
		st.roundRobin = nil
		x.m.marshalled(tCluster, 1)
		if policy != lbPolicies[0].policy {
			st.roundRobin = &resource{any: buildCluster(name, lbPolicies[0].policy), version: x.gen}
			x.m.marshalled(tCluster, 1)
		}
		changed |= tCluster.mask()
	}
	if a := buildAssignment(name, eps); !bytes.Equal(a.Value, st.assignment.any.Value) {
		st.assignment = &resource{any: a, version: x.gen}
		changed |= tEndpoint.mask()
	}
	x.m.marshalled(tEndpoint, 1)
	fresh := x.setOmitted(st, om)
	st.listed = st.present()
	if st.listed != wasListed {
		// Wildcard subscribers list present services only.
		changed |= tListener.mask() | tCluster.mask()
	}
	for s, m := range st.subs {
		if m&changed != 0 {
			s.notify(m & changed)
		}
	}
	for t := range numTypes {
		if changed&t.mask() == 0 {
			continue
		}
		for s := range x.wild[t] {
			s.notify(t.mask())
		}
	}
	if !st.present() && len(st.subs) == 0 {
		delete(x.services, st.svc)
	}
	return fresh
}

// setOmitted records a service's omissions, keeps the counts by reason,
// and returns those that were not there before.
func (x *index) setOmitted(st *svcState, om []omission) []omission {
	for _, o := range st.omitted {
		x.omitted[o.reason]--
	}
	var fresh []omission
	for _, o := range om {
		x.omitted[o.reason]++
		if !slices.ContainsFunc(st.omitted, func(p omission) bool { return p == o }) {
			fresh = append(fresh, o)
		}
	}
	st.omitted = om
	return fresh
}

// markStale records that the registry watch lost its store: the index
// keeps serving what it holds.
func (x *index) markStale(err error) {
	x.apply(registry.Batch{Kind: registry.Stale, Err: err})
}

// stale reports since when the registry watch has been cut off from its
// store (zero while it is live), and why.
func (x *index) stale() (time.Time, error) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.staleSince, x.staleErr
}

// changes returns a channel closed at the next batch applied.
func (x *index) changes() <-chan struct{} {
	x.mu.RLock()
	defer x.mu.RUnlock()
	return x.updated
}

// isReady reports whether the first snapshot is in.
func (x *index) isReady() bool { return x.ready.Load() }

// addStream and removeStream track the open streams; removeStream drops
// every subscription of s.
func (x *index) addStream(s *stream) {
	x.mu.Lock()
	defer x.mu.Unlock()
	x.streams[s] = struct{}{}
}

func (x *index) removeStream(s *stream, subscribed []*svcState) {
	x.mu.Lock()
	defer x.mu.Unlock()
	delete(x.streams, s)
	for t := range x.wild {
		delete(x.wild[t], s)
	}
	for _, st := range subscribed {
		delete(st.subs, s)
		x.collect(st)
	}
}

// collect forgets a service nobody registers nor subscribes to.
func (x *index) collect(st *svcState) {
	if !st.present() && len(st.subs) == 0 && x.services[st.svc] == st {
		delete(x.services, st.svc)
	}
}

// subscribe sets the types s follows of svc (none: unsubscribed) and
// returns its state (nil when mask is empty).
func (x *index) subscribe(s *stream, svc service, mask typeMask) *svcState {
	x.mu.Lock()
	defer x.mu.Unlock()
	st := x.services[svc]
	if st == nil {
		if mask == 0 {
			return nil
		}
		st = x.newService(svc)
		x.services[svc] = st
	}
	if mask == 0 {
		delete(st.subs, s)
		x.collect(st)
		return nil
	}
	st.subs[s] = mask
	return st
}

// setWildcard turns s's wildcard subscription of type t on or off.
func (x *index) setWildcard(s *stream, t rtype, on bool) {
	x.mu.Lock()
	defer x.mu.Unlock()
	if on {
		x.wild[t][s] = struct{}{}
	} else {
		delete(x.wild[t], s)
	}
}

// counts returns the services in the registry, the endpoints their
// assignments hold, and the omissions by reason (for metrics).
func (x *index) counts() (services int, omitted map[string]int) {
	x.mu.RLock()
	defer x.mu.RUnlock()
	for _, st := range x.services {
		if st.present() {
			services++
		}
	}
	omitted = make(map[string]int, len(x.omitted))
	for r, n := range x.omitted {
		omitted[r] = n
	}
	return services, omitted
}
