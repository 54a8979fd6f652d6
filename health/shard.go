package health

import (
	"crypto/sha256"
	"encoding/hex"
	"hash/fnv"
	"net"
	"net/url"
	"slices"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// The checkers' registrations: each checker registers itself as an
// instance of beacon/health/checker, with its ID in the metadata under
// CheckerIDMetadata and its HTTP address as the instance's address.
const (
	CheckersNamespace = "beacon"
	CheckersComponent = "health"
	CheckersEndpoint  = "checker"
	// CheckerIDMetadata is the metadata key of a checker's registration
	// that holds its ID.
	CheckerIDMetadata = "checker"
	// CheckerSuspectMetadata is the metadata key of a checker's
	// registration that is "true" while more than half of its instances
	// fail for it: its peers then count it as seeing as many failures as
	// they do (an outage of the instances, not of one checker).
	CheckerSuspectMetadata = "suspect"
)

// CheckersQuery selects the checkers' registrations.
var CheckersQuery = beacon.Query{Namespace: CheckersNamespace, Component: CheckersComponent, Endpoint: CheckersEndpoint}

// CheckerRef is the instance a checker with the given ID registers as:
// beacon/health/checker/ followed by the first 16 hex digits of the
// SHA-256 of the ID. One ID, one instance ID: a second live checker with
// the same ID cannot register (beacon.ErrAlreadyRegistered) until the
// first is gone.
func CheckerRef(id string) beacon.Ref {
	sum := sha256.Sum256([]byte(id))
	return beacon.Ref{Namespace: CheckersNamespace, Component: CheckersComponent, Endpoint: CheckersEndpoint,
		ID: hex.EncodeToString(sum[:8])}
}

// score is the rendezvous weight of the checker id for the instance at
// ref: FNV-1a (64 bits) of "namespace/component/endpoint/id", a zero
// byte and the checker's ID, mixed with SplitMix64's finaliser. Every
// checker computes the same, so all agree on the owner of every instance
// without talking to each other; a checker that joins or leaves moves
// only the instances it wins or held.
func score(ref beacon.Ref, id string) uint64 {
	h := fnv.New64a()
	_, _ = h.Write([]byte(ref.String()))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write([]byte(id))
	x := h.Sum64()
	x ^= x >> 30
	x *= 0xbf58476d1ce4e5b9
	x ^= x >> 27
	x *= 0x94d049bb133111eb
	x ^= x >> 31
	return x
}

// owner returns which of the checker IDs owns the instance at ref: the
// one of the highest score (ties to the smaller ID), "" for none.
func owner(ref beacon.Ref, ids []string) string {
	var best string
	var bestScore uint64
	for _, id := range ids {
		s := score(ref, id)
		if best == "" || s > bestScore || s == bestScore && id < best {
			best, bestScore = id, s
		}
	}
	return best
}

// target is what a checked instance's Runner needs: its check and the
// address to probe.
type target struct {
	check beacon.Check
	addr  string
}

// probeAddress is where an instance's check probes: its address when it
// is host:port; the host and port of a URL-form address (nats://h:4222/x
// probes h:4222; http and https without a port, ports 80 and 443; another
// scheme without a port leaves the host alone, and the probes fail saying
// that the port is missing).
func probeAddress(addr string) string {
	u, err := url.Parse(addr)
	if err != nil || u.Scheme == "" || u.Host == "" {
		return addr
	}
	if u.Port() != "" {
		return u.Host
	}
	switch u.Scheme {
	case "http":
		return net.JoinHostPort(u.Hostname(), "80")
	case "https":
		return net.JoinHostPort(u.Hostname(), "443")
	}
	return u.Host
}

// peer is one checker as registered.
type peer struct {
	id      string
	addr    string
	suspect bool // CheckerSuspectMetadata
}

// fleet is what a checker knows of the cluster from the registry's watch:
// the live checkers, and the instances that declare a check. It decides
// who owns what.
type fleet struct {
	self       string     // this checker's ID
	selfRef    beacon.Ref // its registration
	registered bool       // its own Register succeeded

	members map[beacon.Ref]peer
	ids     []string // the distinct IDs of members, sorted
	// suspectsChanged: a member's suspect changed since the flag was
	// cleared (which changes no owner).
	suspectsChanged bool
	checked         map[beacon.Ref]target
	// verdicts are the checked instances' verdicts as the registry's
	// view joins them (the checkers' shares are read from them).
	verdicts map[beacon.Ref]beacon.Health
}

func newFleet(id string) *fleet {
	return &fleet{self: id, selfRef: CheckerRef(id), members: map[beacon.Ref]peer{}, checked: map[beacon.Ref]target{},
		verdicts: map[beacon.Ref]beacon.Health{}}
}

// apply applies one batch of the watch and returns the checked instances
// it touched (added, changed or gone) and whether the checkers changed.
func (f *fleet) apply(b registry.Batch) (touched []beacon.Ref, membersChanged bool) {
	if b.Kind == registry.Snapshot {
		for ref := range f.checked {
			touched = append(touched, ref)
		}
		clear(f.checked)
		clear(f.verdicts)
		clear(f.members)
		membersChanged = true
	}
	for _, e := range b.Events {
		in := e.Instance
		ref := in.Ref()
		if in.Namespace == CheckersNamespace && in.Component == CheckersComponent && in.Endpoint == CheckersEndpoint {
			membersChanged = f.applyMember(ref, in, e.Type == beacon.Removed) || membersChanged
			continue
		}
		_, was := f.checked[ref]
		delete(f.verdicts, ref)
		if e.Type == beacon.Removed || in.Check == nil {
			delete(f.checked, ref)
		} else {
			f.checked[ref] = target{check: *in.Check, addr: probeAddress(in.Address)}
			if in.Health != nil {
				f.verdicts[ref] = *in.Health
			}
		}
		if _, is := f.checked[ref]; was || is {
			touched = append(touched, ref)
		}
	}
	if membersChanged {
		f.ids = f.ids[:0]
		for _, p := range f.members {
			if !slices.Contains(f.ids, p.id) {
				f.ids = append(f.ids, p.id)
			}
		}
		slices.Sort(f.ids)
	}
	return touched, membersChanged
}

// applyMember records a checker's registration (its ID from its metadata;
// a registration without one is not a checker) and reports whether the
// members changed.
func (f *fleet) applyMember(ref beacon.Ref, in beacon.Instance, removed bool) bool {
	old, had := f.members[ref]
	id := in.Metadata[CheckerIDMetadata]
	if removed || id == "" {
		delete(f.members, ref)
		return had
	}
	p := peer{id: id, addr: in.Address, suspect: in.Metadata[CheckerSuspectMetadata] == "true"}
	f.members[ref] = p
	f.suspectsChanged = f.suspectsChanged || p.suspect != old.suspect
	return !had || old.id != p.id || old.addr != p.addr
}

// live reports whether this checker takes part: its own registration
// succeeded and the watch shows it.
func (f *fleet) live() bool {
	_, ok := f.members[f.selfRef]
	return f.registered && ok
}

// owner returns the ID of the checker that owns the instance at ref.
func (f *fleet) owner(ref beacon.Ref) string { return owner(ref, f.ids) }

// owned returns the target of the instance at ref if this checker owns
// it.
func (f *fleet) owned(ref beacon.Ref) (target, bool) {
	t, ok := f.checked[ref]
	if !ok || !f.live() || f.owner(ref) != f.self {
		return target{}, false
	}
	return t, true
}

// peers returns the other checkers.
func (f *fleet) peers() []peer {
	var ps []peer
	for _, p := range f.members {
		if p.id != f.self {
			ps = append(ps, p)
		}
	}
	return ps
}
