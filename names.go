package beacon

import (
	"crypto/rand"
	"encoding/binary"
	"strconv"
	"strings"
)

// MaxLabelLength is the longest namespace, component or endpoint name: the
// length of a DNS label.
const MaxLabelLength = 63

// LabelRule is the rule every namespace, component and endpoint obeys, as
// error messages state it.
const LabelRule = "must be a DNS label: 1-63 lower-case letters, digits or '-', starting and ending with a letter or digit"

// ReadLabelRule is the rule of the component and endpoint names Beacon
// reads and serves (ValidateReadLabel), as error messages state it.
const ReadLabelRule = "must be 1-63 lower-case letters, digits, '_' or '-'"

// ReadNamespaceRule is the rule of the namespaces Beacon reads and serves
// (ValidateReadNamespace), as error messages state it.
const ReadNamespaceRule = "must be one or more names of 1-63 lower-case letters, digits, '_' or '-', joined by '.' (at most 253 characters)"

// MaxNamespaceLength is the longest namespace Beacon reads: the length of
// a DNS name.
const MaxNamespaceLength = 253

// IDRule is the rule instance IDs obey, as error messages state it.
const IDRule = "must be 16 lower-case hex digits, e.g. 3f2a9c0d11e4b5a7"

// IDLength is the number of hex digits in an instance ID.
const IDLength = 16

// ValidateLabel checks that value is a DNS label (RFC 1123, lower case) and
// returns a *FieldError naming field otherwise.
func ValidateLabel(field, value string) error {
	if !isLabel(value) {
		return fieldError(ErrInvalidName, field, value, LabelRule)
	}
	return nil
}

func isLabel(s string) bool {
	if len(s) == 0 || len(s) > MaxLabelLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case 'a' <= c && c <= 'z', '0' <= c && c <= '9':
		case c == '-' && i > 0 && i < len(s)-1:
		default:
			return false
		}
	}
	return true
}

// Beacon reads more names than it writes. Its writers (Instance.Validate,
// and so every registration) keep ValidateLabel: DNS labels. What it reads
// and serves, and so what a Query or a Ref may name, also takes the names
// of the NVIDIA Dynamo runtime, whose registrations Beacon can serve
// read-only (registry.LayoutDynamo): '_' anywhere, a leading or trailing
// '-', and namespaces nested with dots ("ns1.ns2"). Each consumer serves
// them where it can and says where it cannot (docs/dynamo.md, "Names").

// ValidateReadLabel checks that value is a component or endpoint name
// Beacon reads and serves (ReadLabelRule): every name ValidateLabel
// accepts, and the names of the NVIDIA Dynamo runtime. It returns a
// *FieldError naming field otherwise.
func ValidateReadLabel(field, value string) error {
	if !isReadLabel(value) {
		return fieldError(ErrInvalidName, field, value, ReadLabelRule)
	}
	return nil
}

// ValidateReadNamespace checks that ns is a namespace Beacon reads and
// serves (ReadNamespaceRule): ValidateReadLabel names joined by dots.
func ValidateReadNamespace(ns string) error {
	if len(ns) > MaxNamespaceLength {
		return fieldError(ErrInvalidName, "namespace", ns, ReadNamespaceRule)
	}
	for part := range strings.SplitSeq(ns, ".") {
		if !isReadLabel(part) {
			return fieldError(ErrInvalidName, "namespace", ns, ReadNamespaceRule)
		}
	}
	return nil
}

// validateReadName checks the namespace, component or endpoint field
// against the read rules.
func validateReadName(field, value string) error {
	if field == "namespace" {
		return ValidateReadNamespace(value)
	}
	return ValidateReadLabel(field, value)
}

func isReadLabel(s string) bool {
	if len(s) == 0 || len(s) > MaxLabelLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '_') {
			return false
		}
	}
	return true
}

// CheckDNSName reports whether DNS can name the instances of namespace ns
// and endpoint ep (nil if it can): every name Beacon's writers write, and
// of the read names all but a namespace nested with dots (DNS reads names
// from the right: it would be read as several) and an endpoint starting
// with '_' (it would stand where _tcp and _udp do; RFC 8552 keeps leading
// underscores for such labels). Underscores elsewhere are served: DNS
// carries them.
func CheckDNSName(ns, ep string) error {
	switch {
	case strings.Contains(ns, "."):
		return fieldError(ErrInvalidName, "namespace", ns, "holds dots, which DNS would read as several names")
	case strings.HasPrefix(ep, "_"):
		return fieldError(ErrInvalidName, "endpoint", ep, "starts with '_', which DNS keeps for labels such as _tcp (RFC 8552)")
	}
	return nil
}

// ValidateID checks that id is an instance ID: exactly 16 lower-case hex
// digits.
func ValidateID(id string) error {
	if !isID(id) {
		return fieldError(ErrInvalidID, "instance id", id, IDRule)
	}
	return nil
}

func isID(s string) bool {
	if len(s) != IDLength {
		return false
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		if !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}

// NewID returns a fresh random instance ID (64 bits from crypto/rand).
func NewID() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read never fails on supported platforms.
	return FormatID(binary.BigEndian.Uint64(b[:]))
}

// FormatID renders a 64-bit number as an instance ID (zero-padded hex).
func FormatID(n uint64) string {
	s := strconv.FormatUint(n, 16)
	const zeros = "0000000000000000"
	return zeros[:IDLength-len(s)] + s
}
