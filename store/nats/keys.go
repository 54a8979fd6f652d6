package nats

import (
	"fmt"
	"strings"

	"github.com/beaconplane/beacon/store"
)

// Beacon keys are arbitrary UTF-8; NATS KV keys allow only [-/_=.a-zA-Z0-9]
// with '.' separating subject tokens. A key is split at '/' and each segment
// becomes one token: the bytes [-_a-zA-Z0-9] stand for themselves, every
// other byte is "=XX" (upper-case hex), and the empty segment is the token
// "=" alone (which no non-empty segment encodes to). The mapping is
// reversible and per-byte, so a prefix that ends at a '/' is a subject
// wildcard: "/services/prod/" lists "$KV.<bucket>.k.=.services.prod.>".
// A prefix that ends inside a segment is matched as the wildcard of its
// complete segments, then filtered by key.

const hexDigits = "0123456789ABCDEF"

func plain(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_'
}

func appendSegment(b *strings.Builder, seg string) {
	if seg == "" {
		b.WriteByte('=')
		return
	}
	for i := 0; i < len(seg); i++ {
		if c := seg[i]; plain(c) {
			b.WriteByte(c)
		} else {
			b.WriteByte('=')
			b.WriteByte(hexDigits[c>>4])
			b.WriteByte(hexDigits[c&15])
		}
	}
}

// encodeKey returns the subject tokens of key.
func encodeKey(key string) string {
	var b strings.Builder
	b.Grow(len(key) + 8)
	for i, seg := range strings.Split(key, "/") {
		if i > 0 {
			b.WriteByte('.')
		}
		appendSegment(&b, seg)
	}
	return b.String()
}

func unhex(c byte) (byte, bool) {
	switch {
	case c >= '0' && c <= '9':
		return c - '0', true
	case c >= 'A' && c <= 'F':
		return c - 'A' + 10, true
	}
	return 0, false
}

// decodeKey reverses encodeKey. It accepts only the canonical encoding, so
// every valid key has exactly one subject.
func decodeKey(tokens string) (string, error) {
	var b strings.Builder
	b.Grow(len(tokens))
	for i, tok := range strings.Split(tokens, ".") {
		if i > 0 {
			b.WriteByte('/')
		}
		if tok == "=" {
			continue
		}
		if tok == "" {
			return "", fmt.Errorf("nats: subject %q has an empty token", tokens)
		}
		for j := 0; j < len(tok); j++ {
			c := tok[j]
			if plain(c) {
				b.WriteByte(c)
				continue
			}
			if c != '=' || j+2 >= len(tok) {
				return "", fmt.Errorf("nats: subject %q: bad escape in token %q", tokens, tok)
			}
			hi, ok1 := unhex(tok[j+1])
			lo, ok2 := unhex(tok[j+2])
			v := hi<<4 | lo
			if !ok1 || !ok2 || plain(v) {
				return "", fmt.Errorf("nats: subject %q: bad escape in token %q", tokens, tok)
			}
			b.WriteByte(v)
			j += 2
		}
	}
	key := b.String()
	if err := store.ValidateKey(key); err != nil {
		return "", fmt.Errorf("nats: subject %q: %w", tokens, err)
	}
	return key, nil
}

// prefixFilter returns the subject tokens filter (ending in ">") that
// covers every key starting with prefix, and whether every key it matches
// does start with prefix (otherwise results must be filtered by key).
func prefixFilter(prefix string) (filter string, exact bool) {
	segs := strings.Split(prefix, "/")
	var b strings.Builder
	for _, seg := range segs[:len(segs)-1] {
		appendSegment(&b, seg)
		b.WriteByte('.')
	}
	b.WriteByte('>')
	return b.String(), segs[len(segs)-1] == ""
}
