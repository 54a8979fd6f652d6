package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"path"
	"sort"
	"strings"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

// CreatedKey is where CreateToken records when it created the token,
// "/_etcd/registry/<token>/_config/created" (RFC 3339, UTC). etcd's
// discovery reads only the size key and the members, so it ignores this
// key; a token written by hand (etcdctl put of the size key) has none.
func CreatedKey(token string) string { return path.Join(RegistryPrefix, token, "_config/created") }

// TokenSummary is one token of ListTokens (and of GET /v1/tokens).
type TokenSummary struct {
	Token string `json:"token"`
	// Size is the cluster size from the size key; 0 when the key is
	// missing or bad (Problem says which).
	Size int `json:"size"`
	// State is waiting or full, or, when the size is not known,
	// no_size or bad_size (Problem says more).
	State State `json:"state"`
	// Full is State == full: the first Size members registered.
	Full bool `json:"full"`
	// Registered is how many of the Size slots are taken; Members counts
	// every valid registration, including those that came too late.
	Registered int `json:"registered"`
	Members    int `json:"members"`
	// CreatedRevision is the revision at which the size key was written
	// (of the token's first key when there is no size key).
	CreatedRevision int64 `json:"created_revision"`
	// CreatedAt is when CreateToken created the token; absent for tokens
	// written otherwise.
	CreatedAt *time.Time `json:"created_at,omitempty"`
	// Problem says what is wrong with a token whose size key is missing
	// or bad (Size 0, State no_size or bad_size), or with a full token whose members
	// cannot form a cluster: two share a name or a peer URL, or a URL
	// etcd refuses (the error InitialCluster gives; GET /v1/tokens/{token}
	// and beacon token status give it too).
	Problem string `json:"problem,omitempty"`
}

// TokenList is the answer of ListTokens.
type TokenList struct {
	// Revision is the store revision of the listing.
	Revision int64          `json:"revision"`
	Tokens   []TokenSummary `json:"tokens"`
}

// ListTokens reads every token of the registry at one revision, sorted by
// creation (revision), with its size, registrations and state. Keys under
// the registry prefix that are not a token's are ignored. Give ctx a
// deadline.
func ListTokens(ctx context.Context, cli *clientv3.Client) (TokenList, error) {
	resp, err := cli.Get(ctx, RegistryPrefix+"/", clientv3.WithPrefix())
	if err != nil {
		return TokenList{}, fmt.Errorf("bootstrap: list tokens: %w", err)
	}
	type entry struct {
		reg       *registry
		sizeSeen  bool
		firstRev  int64
		sizeRev   int64
		createdAt *time.Time
	}
	byToken := map[string]*entry{}
	for _, kv := range resp.Kvs {
		rest, ok := strings.CutPrefix(string(kv.Key), RegistryPrefix+"/")
		if !ok {
			continue
		}
		token, _, _ := strings.Cut(rest, "/")
		if ValidateToken(token) != nil {
			continue
		}
		e := byToken[token]
		if e == nil {
			e = &entry{reg: newRegistry(token)}
			byToken[token] = e
		}
		if e.firstRev == 0 || kv.CreateRevision < e.firstRev {
			e.firstRev = kv.CreateRevision
		}
		switch key := string(kv.Key); {
		case key == SizeKey(token):
			e.reg.setSize(kv.Value, true)
			e.sizeSeen, e.sizeRev = true, kv.CreateRevision
		case key == CreatedKey(token):
			if t, err := time.Parse(time.RFC3339Nano, string(kv.Value)); err == nil {
				t = t.UTC()
				e.createdAt = &t
			}
		case strings.HasPrefix(key, MembersPrefix(token)):
			e.reg.put(key, string(kv.Value), kv.CreateRevision)
		}
	}
	list := TokenList{Revision: resp.Header.Revision, Tokens: make([]TokenSummary, 0, len(byToken))}
	for token, e := range byToken {
		if !e.sizeSeen {
			e.reg.setSize(nil, false)
		}
		st := e.reg.status()
		s := TokenSummary{
			Token: token, Size: st.Size, Members: len(st.Members),
			CreatedRevision: e.firstRev, CreatedAt: e.createdAt,
		}
		if e.sizeSeen {
			s.CreatedRevision = e.sizeRev
		}
		if e.reg.sizeErr != nil {
			s.Size, s.Problem, s.State = 0, e.reg.sizeErr.Error(), StateNoSize
			if errors.Is(e.reg.sizeErr, ErrBadSizeKey) {
				s.State = StateBadSize
			}
		} else {
			s.State, s.Registered, s.Full = st.State, st.Registered(), st.State == StateFull
			if _, err := st.InitialCluster(); s.Full && err != nil {
				s.Problem = err.Error() // listed as plain "full" before
			}
		}
		list.Tokens = append(list.Tokens, s)
	}
	sort.Slice(list.Tokens, func(i, j int) bool {
		a, b := list.Tokens[i], list.Tokens[j]
		if a.CreatedRevision != b.CreatedRevision {
			return a.CreatedRevision < b.CreatedRevision
		}
		return a.Token < b.Token
	})
	return list, nil
}
