package bootstrap

import (
	"crypto/sha1"
	"encoding/binary"
	"slices"
	"strings"
	"unicode"
	"unicode/utf8"

	"go.etcd.io/etcd/client/pkg/v3/types"
)

// MaxNameLen is the longest member name Beacon registers, in bytes.
const MaxNameLen = 255

// Member is one registration under a token.
type Member struct {
	// ID is the member ID: the last element of Key, the lower-case hex of
	// the raft ID etcd computes from the peer URLs and the token.
	ID string `json:"id"`
	// Name is the member name (the part before "=" in Value).
	Name string `json:"name"`
	// PeerURLs are the URLs in Value, in the order written.
	PeerURLs []string `json:"peer_urls"`
	// Value is the registration as stored, "name=url[,name=url…]",
	// trimmed of surrounding space as etcd reads it.
	Value string `json:"value"`
	// Key is the registry key.
	Key string `json:"key"`
	// CreateRevision orders registrations: the first Size win.
	CreateRevision int64 `json:"create_revision"`
}

// ValidateName checks a member name: 1 to MaxNameLen bytes of printable
// UTF-8 without spaces, ',' or '=' (they would break the
// "name=url,name=url" format etcd stores and parses).
func ValidateName(name string) error {
	switch {
	case name == "":
		return invalid(ErrInvalidMember, "empty member name")
	case len(name) > MaxNameLen:
		return invalid(ErrInvalidMember, "member name of %d bytes is longer than the %d-byte limit", len(name), MaxNameLen)
	case !utf8.ValidString(name):
		return invalid(ErrInvalidMember, "member name %q is not valid UTF-8", shorten(name))
	}
	for _, r := range name {
		if r == ',' || r == '=' || unicode.IsSpace(r) || !unicode.IsPrint(r) {
			return invalid(ErrInvalidMember, "member name %q has %q: spaces, control characters, ',' and '=' are not allowed",
				shorten(name), r)
		}
	}
	return nil
}

// CanonicalPeerURLs checks peer URLs by etcd's rules (scheme http, https,
// unix or unixs; http(s) URLs with host:port and no path) and returns them
// in etcd's canonical form, sorted. Duplicates and an empty list are
// refused.
func CanonicalPeerURLs(peerURLs []string) ([]string, error) {
	if len(peerURLs) == 0 {
		return nil, invalid(ErrInvalidMember, "no peer URLs: give at least one, e.g. http://10.0.0.1:2380")
	}
	for _, u := range peerURLs {
		if strings.TrimSpace(u) == "" {
			return nil, invalid(ErrInvalidMember, "empty peer URL in %q", shorten(strings.Join(peerURLs, ",")))
		}
		if strings.ContainsAny(u, ",=") {
			return nil, invalid(ErrInvalidMember, "peer URL %q has ',' or '=': give one URL per list element", shorten(u))
		}
	}
	urls, err := types.NewURLs(peerURLs)
	if err != nil {
		return nil, invalid(ErrInvalidMember, "peer URLs %q: %v", shorten(strings.Join(peerURLs, ",")), err)
	}
	out := urls.StringSlice()
	for i := 1; i < len(out); i++ {
		if out[i] == out[i-1] {
			return nil, invalid(ErrDuplicateURL, "peer URL %q is listed twice", out[i])
		}
	}
	return out, nil
}

// MemberID returns the ID etcd gives a member that bootstraps through
// discovery: the first 8 bytes, big-endian, of the SHA-1 of its sorted peer
// URLs joined without separator followed by the token (etcd's
// membership.computeMemberID with the discovery token as cluster token and
// no timestamp).
func MemberID(peerURLs []string, token string) (uint64, error) {
	urls, err := CanonicalPeerURLs(peerURLs)
	if err != nil {
		return 0, err
	}
	return memberID(urls, token), nil
}

// memberID hashes canonical, sorted URLs.
func memberID(sortedURLs []string, token string) uint64 {
	h := sha1.Sum([]byte(strings.Join(sortedURLs, "") + token))
	return binary.BigEndian.Uint64(h[:8])
}

// MemberValue returns the registration value etcd writes for a member:
// "name=url" pairs for each peer URL, sorted, joined by ','.
func MemberValue(name string, peerURLs []string) (string, error) {
	if err := ValidateName(name); err != nil {
		return "", err
	}
	urls, err := CanonicalPeerURLs(peerURLs)
	if err != nil {
		return "", err
	}
	return memberValue(name, urls), nil
}

func memberValue(name string, sortedURLs []string) string {
	pairs := make([]string, len(sortedURLs))
	for i, u := range sortedURLs {
		pairs[i] = name + "=" + u
	}
	slices.Sort(pairs)
	return strings.Join(pairs, ",")
}

// ParseMemberValue splits a registration value into its name and peer
// URLs, checking it as etcd would when it builds the initial cluster: one
// or more "name=url" pairs joined by ',', one name, valid peer URLs. It
// fails with ErrInvalidURL.
func ParseMemberValue(value string) (name string, peerURLs []string, err error) {
	value = strings.TrimSpace(value)
	if value == "" {
		return "", nil, invalidValue(ErrInvalidURL, value, "empty registration")
	}
	for pair := range strings.SplitSeq(value, ",") {
		n, u, ok := strings.Cut(pair, "=")
		switch {
		case !ok || n == "":
			return "", nil, invalidValue(ErrInvalidURL, value, "want name=url[,name=url…]")
		case name != "" && n != name:
			return "", nil, invalidValue(ErrInvalidURL, value, "one registration holds two names, "+name+" and "+n)
		}
		name = n
		peerURLs = append(peerURLs, u)
	}
	if _, err := types.NewURLs(peerURLs); err != nil {
		return "", nil, invalidValue(ErrInvalidURL, value, err.Error())
	}
	return name, peerURLs, nil
}

// memberFromKV builds a Member from a registry entry the way etcd's
// clusterInfo.add accepts it: the key must start with the members prefix
// and the trimmed value must contain '='. It reports why an entry is
// skipped. Name and PeerURLs are parsed leniently (the strict check happens
// when the initial cluster is built, as in etcd).
func memberFromKV(token, key, value string, createRev int64) (Member, string) {
	key = strings.TrimSpace(key)
	value = strings.TrimSpace(value)
	if !strings.HasPrefix(key, MembersPrefix(token)) {
		return Member{}, "invalid peer registry key"
	}
	if !strings.ContainsRune(value, '=') {
		return Member{}, "invalid peer info returned from discovery service"
	}
	m := Member{ID: key[strings.LastIndexByte(key, '/')+1:], Value: value, Key: key, CreateRevision: createRev}
	for pair := range strings.SplitSeq(value, ",") {
		n, u, ok := strings.Cut(pair, "=")
		if !ok {
			continue
		}
		if m.Name == "" {
			m.Name = n
		}
		m.PeerURLs = append(m.PeerURLs, u)
	}
	return m, ""
}
