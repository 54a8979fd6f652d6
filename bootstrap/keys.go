package bootstrap

import (
	"fmt"
	"path"
	"strconv"
	"unicode/utf8"

	"github.com/beaconplane/beacon/internal/clip"
	"github.com/google/uuid"
)

// RegistryPrefix is where etcd's v3 discovery keeps every token.
const RegistryPrefix = "/_etcd/registry"

// Limits on what Beacon accepts when it creates a token.
const (
	// MaxTokenLen is the longest token, in bytes.
	MaxTokenLen = 128
	// MaxSize is the largest cluster size CreateToken accepts. It only
	// catches typos: etcd recommends 3, 5 or 7 voting members.
	MaxSize = 1000
)

// NewToken returns a fresh random token: a version 4 UUID in lower case,
// the convention of etcd's documentation.
func NewToken() string { return uuid.NewString() }

// ValidateToken checks a token. etcd itself accepts any string, but a token
// becomes part of registry keys through path.Join, so Beacon accepts only
// 1 to MaxTokenLen characters of [A-Za-z0-9._-] starting with a letter or
// digit. UUIDs in either case, discovery.etcd.io's 32 hex digits and names
// like "prod-cluster-1" all fit.
func ValidateToken(token string) error {
	switch {
	case token == "":
		return invalid(ErrInvalidToken, "empty token: create one with `beacon token new`")
	case len(token) > MaxTokenLen:
		return invalid(ErrInvalidToken, "token of %d bytes is longer than the %d-byte limit", len(token), MaxTokenLen)
	case !isAlnum(token[0]):
		return invalid(ErrInvalidToken, "token %q must start with a letter or digit", shorten(token))
	}
	for i, r := range token {
		if r < utf8.RuneSelf && (isAlnum(byte(r)) || r == '-' || r == '_' || r == '.') {
			continue
		}
		// Name the character itself (a byte of a multi-byte character
		// printed as a rune was mojibake: 'Ã' for é).
		what := fmt.Sprintf("%q (U+%04X)", r, r)
		if r == utf8.RuneError {
			if _, n := utf8.DecodeRuneInString(token[i:]); n <= 1 {
				what = fmt.Sprintf("the byte 0x%02x (not UTF-8)", token[i])
			}
		}
		return invalid(ErrInvalidToken, "token %q has %s at byte %d: use only ASCII letters, digits, '-', '_' and '.'",
			shorten(token), what, i)
	}
	return nil
}

func isAlnum(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9'
}

// ValidateSize checks a cluster size for a new token: 1 to MaxSize.
func ValidateSize(size int) error {
	if size < 1 || size > MaxSize {
		return invalid(ErrInvalidSize, "size %d: a cluster has 1 to %d members (3, 5 or 7 is usual)", size, MaxSize)
	}
	return nil
}

// ParseSize parses a size key's value exactly as etcd does (a base-10
// integer greater than 0, sign allowed, no spaces); anything else is
// ErrBadSizeKey.
func ParseSize(value string) (int, error) {
	n, err := strconv.ParseInt(value, 10, 0)
	if err != nil || n <= 0 {
		return 0, invalidValue(ErrBadSizeKey, value, "want a base-10 integer greater than 0")
	}
	return int(n), nil
}

// TokenPrefix is the prefix of every key of the token, with a trailing
// slash so that it never matches another token ("/_etcd/registry/<token>/").
func TokenPrefix(token string) string { return path.Join(RegistryPrefix, token) + "/" }

// SizeKey is the key holding the cluster size,
// "/_etcd/registry/<token>/_config/size".
func SizeKey(token string) string { return path.Join(RegistryPrefix, token, "_config/size") }

// MembersPrefix is the prefix etcd lists and watches for registrations,
// "/_etcd/registry/<token>/members" — without a trailing slash, as etcd
// uses it, so that Beacon counts exactly the keys etcd counts.
func MembersPrefix(token string) string { return path.Join(RegistryPrefix, token, "members") }

// MemberKey is the registration key of a member,
// "/_etcd/registry/<token>/members/<id>", with the ID in lower-case hex
// without padding (etcd's types.ID.String()).
func MemberKey(token string, id uint64) string {
	return path.Join(MembersPrefix(token), FormatID(id))
}

// NamesPrefix is where Beacon's members claim their names,
// "/_etcd/registry/<token>/_names/". etcd's discovery reads only the size
// key and the keys under MembersPrefix, so it ignores these keys.
func NamesPrefix(token string) string { return TokenPrefix(token) + "_names/" }

// NameKey is the claim of a member name under a token: its value is the
// member ID that holds the name. Join writes it in the same transaction as
// the registration, only if no other registered member holds it, so that
// two Beacon members can never register under one name. The name is
// appended as is (ValidateName allows '/'; path.Join would clean "..").
func NameKey(token, name string) string { return NamesPrefix(token) + name }

// FormatID renders a member ID as etcd does: lower-case hex, no padding.
func FormatID(id uint64) string { return strconv.FormatUint(id, 16) }

// ParseID parses a member ID exactly as FormatID (and etcd) render it:
// lower-case hex without leading zeros.
func ParseID(s string) (uint64, error) {
	id, err := strconv.ParseUint(s, 16, 64)
	if err != nil || FormatID(id) != s {
		return 0, invalid(ErrInvalidMember, "member ID %q: want lower-case hex without leading zeros, as etcd writes it", shorten(s))
	}
	return id, nil
}

// shorten keeps messages readable when the input is huge.
func shorten(s string) string { return clip.String(s, 80) }
