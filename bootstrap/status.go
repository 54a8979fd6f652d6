package bootstrap

import (
	"fmt"
	"slices"
	"strings"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// State says where a token's bootstrap stands.
type State string

const (
	// StateWaiting: fewer members than the size have registered.
	StateWaiting State = "waiting"
	// StateFull: the first size members have registered; the cluster
	// can form, and any later member gets ErrFullCluster.
	StateFull State = "full"
	// StateNoSize: the token has keys but no size key (it was removed,
	// or never created); no member can join. ListTokens only.
	StateNoSize State = "no_size"
	// StateBadSize: the size key is not an integer greater than 0; no
	// member can join. ListTokens only.
	StateBadSize State = "bad_size"
)

// Status is a token's registry as read at one revision.
type Status struct {
	Token string `json:"token"`
	// Size is the cluster size from the size key.
	Size  int   `json:"size"`
	State State `json:"state"`
	// Members are the valid registrations in registration (create
	// revision) order. The first Size are the cluster; any after them
	// registered too late and were told the cluster is full.
	Members []Member `json:"members"`
	// Skipped are entries under the members prefix that etcd ignores
	// too, with the reason (etcd's own log message).
	Skipped []Skipped `json:"skipped,omitempty"`
	// Revision is the store revision of the snapshot.
	Revision int64 `json:"revision"`
}

// Skipped is a registry entry that is not a valid registration.
type Skipped struct {
	Key    string `json:"key"`
	Value  string `json:"value"`
	Reason string `json:"reason"`
}

// Registered is how many of the cluster's Size slots are taken.
func (s Status) Registered() int { return min(len(s.Members), s.Size) }

// In returns the members that form the cluster so far (at most Size).
func (s Status) In() []Member { return s.Members[:s.Registered()] }

// Late returns the members that registered after the cluster was full.
func (s Status) Late() []Member { return s.Members[s.Registered():] }

// InitialCluster returns the --initial-cluster string of a full token:
// the values of the first Size members in registration order, joined by
// ','. It checks the result as etcd does before bootstrapping (valid URLs,
// ErrInvalidURL), and also that no two members share a name
// (ErrDuplicateName) or a peer URL (ErrDuplicateURL).
func (s Status) InitialCluster() (string, error) {
	if s.State != StateFull {
		return "", fmt.Errorf("bootstrap: token %q has %d of %d members registered; the initial cluster is not known yet",
			s.Token, s.Registered(), s.Size)
	}
	return initialCluster(s.In())
}

// Cluster returns the bootstrapped cluster of a full token.
func (s Status) Cluster() (Cluster, error) {
	ic, err := s.InitialCluster()
	if err != nil {
		return Cluster{}, err
	}
	return Cluster{
		Token:          s.Token,
		Size:           s.Size,
		Members:        slices.Clone(s.In()),
		InitialCluster: ic,
		Revision:       s.Revision,
	}, nil
}

func initialCluster(members []Member) (string, error) {
	values := make([]string, len(members))
	for i, m := range members {
		values[i] = m.Value
	}
	ic := strings.Join(values, ",")
	if _, err := types.NewURLsMap(ic); err != nil {
		bad := ""
		for _, m := range members {
			if _, _, perr := ParseMemberValue(m.Value); perr != nil {
				bad = fmt.Sprintf(" (member %s, key %s, registered %q)", shorten(m.Name), m.Key, shorten(m.Value))
				break
			}
		}
		return "", fmt.Errorf("%w: %s%s", ErrInvalidURL, shorten(err.Error()), bad)
	}
	names := make(map[string]string, len(members))
	urls := make(map[string]string)
	for _, m := range members {
		name, peerURLs, _ := ParseMemberValue(m.Value)
		if other, ok := names[name]; ok {
			return "", fmt.Errorf("%w: %q is registered by %s and %s: every member needs its own name",
				ErrDuplicateName, shorten(name), other, m.Key)
		}
		names[name] = m.Key
		canon, _ := types.NewURLs(peerURLs)
		for _, u := range canon.StringSlice() {
			if other, ok := urls[u]; ok && other != m.Key {
				return "", fmt.Errorf("%w: %s is registered by %s and %s (discovery cluster %s has duplicate url)",
					ErrDuplicateURL, shorten(u), other, m.Key, shorten(ic))
			}
			urls[u] = m.Key
		}
	}
	return ic, nil
}

// Cluster is a bootstrapped (full) cluster: what a member needs to start.
type Cluster struct {
	// Token is the discovery token. Members must use it as their initial
	// cluster token (etcd's --initial-cluster-token), so that the member
	// IDs etcd computes match the registry keys.
	Token string `json:"token"`
	Size  int    `json:"size"`
	// Members are the Size members in registration order.
	Members []Member `json:"members"`
	// InitialCluster is the --initial-cluster string, e.g.
	// "infra1=http://10.0.0.1:2380,infra2=http://10.0.0.2:2380".
	InitialCluster string `json:"initial_cluster"`
	// Revision is the store revision at which the cluster was read.
	Revision int64 `json:"revision"`
}

// registry accumulates a token's entries; it is the state behind Status
// that Join and GetCluster keep up to date from a watch.
type registry struct {
	token   string
	size    int
	sizeErr error // ErrSizeNotFound or ErrBadSizeKey (wrapped), or nil
	members []Member
	skipped []Skipped
	rev     int64
}

func newRegistry(token string) *registry {
	return &registry{token: token, sizeErr: ErrSizeNotFound}
}

// setSize records the size key's value (nil: absent).
func (r *registry) setSize(value []byte, present bool) {
	switch {
	case !present:
		r.size, r.sizeErr = 0, fmt.Errorf("%w: no %s: the token was never created or has been removed (create one with `beacon token new`)",
			ErrSizeNotFound, SizeKey(r.token))
	default:
		n, err := ParseSize(string(value))
		r.size, r.sizeErr = n, err
	}
}

// put adds or replaces a registration.
func (r *registry) put(key, value string, createRev int64) {
	r.remove(key)
	m, reason := memberFromKV(r.token, key, value, createRev)
	if reason != "" {
		r.skipped = append(r.skipped, Skipped{Key: strings.TrimSpace(key), Value: strings.TrimSpace(value), Reason: reason})
		return
	}
	i, _ := slices.BinarySearchFunc(r.members, m, func(a, b Member) int {
		switch {
		case a.CreateRevision < b.CreateRevision:
			return -1
		case a.CreateRevision > b.CreateRevision:
			return 1
		}
		return strings.Compare(a.Key, b.Key)
	})
	r.members = slices.Insert(r.members, i, m)
}

// remove forgets a registration (a deleted key).
func (r *registry) remove(key string) {
	key = strings.TrimSpace(key)
	r.members = slices.DeleteFunc(r.members, func(m Member) bool { return m.Key == key })
	r.skipped = slices.DeleteFunc(r.skipped, func(s Skipped) bool { return s.Key == key })
}

// index returns the position of the member with the key, or -1.
func (r *registry) index(key string) int {
	return slices.IndexFunc(r.members, func(m Member) bool { return m.Key == key })
}

func (r *registry) full() bool { return r.sizeErr == nil && len(r.members) >= r.size }

func (r *registry) status() Status {
	st := Status{
		Token:    r.token,
		Size:     r.size,
		State:    StateWaiting,
		Members:  slices.Clone(r.members),
		Skipped:  slices.Clone(r.skipped),
		Revision: r.rev,
	}
	if st.Members == nil {
		st.Members = []Member{}
	}
	if r.full() {
		st.State = StateFull
	}
	return st
}
