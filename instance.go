package beacon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
	"net/netip"
	"net/url"
	"strconv"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// Status tells callers whether an instance takes new work.
type Status string

const (
	// StatusServing instances take new work.
	StatusServing Status = "serving"
	// StatusDraining instances finish what they have and take nothing new;
	// resolvers stop sending to them.
	StatusDraining Status = "draining"
)

// Limits on an instance's free-form fields.
const (
	// DefaultMaxMetadataSize bounds the metadata of one instance: the sum of
	// the lengths of its keys and values. Larger metadata is refused, never
	// truncated.
	DefaultMaxMetadataSize = 4 << 10
	// MaxAddressLength bounds an address.
	MaxAddressLength = 1024
	// MaxMetadataKeyLength bounds one metadata key.
	MaxMetadataKeyLength = 253
)

// Instance is one registered endpoint of one component: the unit of
// discovery. Its JSON form is the value stored at its key.
type Instance struct {
	Namespace string `json:"namespace"`
	Component string `json:"component"`
	Endpoint  string `json:"endpoint"`
	// ID is 16 lower-case hex digits, stable for the life of the
	// registration (also across lease loss). A string in JSON, so that
	// JavaScript clients keep every bit.
	ID string `json:"id"`
	// Address is where callers reach the instance: host:port, or a URL
	// such as nats://host:4222/subject.
	Address string `json:"address"`
	// Transport names the protocol spoken at Address ("grpc", "http",
	// "tcp", "nats", ...). Empty means unspecified.
	Transport string `json:"transport"`
	// Metadata is free-form, at most DefaultMaxMetadataSize bytes of keys
	// and values. Resolvers expose it (weight, zone, ...) to balancers.
	Metadata map[string]string `json:"metadata,omitempty"`
	// Status is serving or draining. Empty is read as serving.
	Status       Status    `json:"status"`
	RegisteredAt time.Time `json:"registered_at"`
	// Check is the health check the registrant declares, nil for none:
	// the checkers (beacon serve) run it from outside the process.
	Check *Check `json:"check,omitempty"`
	// Health is the checkers' verdict, filled by the registry for readers
	// of an instance that declares a Check. It is never stored with the
	// instance: writers leave it nil, and what a stored value says is
	// ignored.
	Health *Health `json:"health,omitempty"`
}

// Ref returns the instance's name.
func (in Instance) Ref() Ref {
	return Ref{Namespace: in.Namespace, Component: in.Component, Endpoint: in.Endpoint, ID: in.ID}
}

// Serving reports whether the instance takes new work: it is not
// draining, and its health check (if it declares one) is not failing.
func (in Instance) Serving() bool {
	return (in.Status == "" || in.Status == StatusServing) && !in.Health.Failing()
}

// Draining reports whether the instance's registrant said it takes no new
// work (as opposed to its health check failing).
func (in Instance) Draining() bool { return in.Status == StatusDraining }

// Clone returns a deep copy.
func (in Instance) Clone() Instance {
	in.Metadata = maps.Clone(in.Metadata)
	if in.Check != nil {
		c := *in.Check
		in.Check = &c
	}
	if in.Health != nil {
		h := *in.Health
		in.Health = &h
	}
	return in
}

// Equal reports whether two instances are the same in every field.
func (in Instance) Equal(o Instance) bool {
	return in.Namespace == o.Namespace && in.Component == o.Component && in.Endpoint == o.Endpoint &&
		in.ID == o.ID && in.Address == o.Address && in.Transport == o.Transport &&
		in.Status == o.Status && in.RegisteredAt.Equal(o.RegisteredAt) && maps.Equal(in.Metadata, o.Metadata) &&
		equalPtr(in.Check, o.Check) && equalHealth(in.Health, o.Health)
}

func equalPtr[T comparable](a, b *T) bool { return a == b || a != nil && b != nil && *a == *b }

func equalHealth(a, b *Health) bool {
	return a == b || a != nil && b != nil && a.Status == b.Status && a.Reason == b.Reason &&
		a.Since.Equal(b.Since) && a.Checker == b.Checker && a.Panic == b.Panic
}

// Validate checks every field against the rules of the key layout and the
// limits above, with the default metadata limit.
func (in Instance) Validate() error { return in.ValidateWith(DefaultMaxMetadataSize) }

// ValidateWith is Validate with a caller-chosen metadata limit.
func (in Instance) ValidateWith(maxMetadata int) error { return in.validate(maxMetadata, true) }

// ValidateStored is ValidateWith for an instance read back from a store:
// it also accepts control characters in metadata values and host names
// longer than DNS carries, which writers refuse (ValidateMetadata,
// ValidateAddress) but other or older writers may have stored; readers
// show them escaped.
func (in Instance) ValidateStored(maxMetadata int) error { return in.validate(maxMetadata, false) }

// ValidateRead is ValidateStored for an instance read from what another
// writer stored (the NVIDIA Dynamo runtime's registrations): its names
// obey the read rules (Ref.Validate) rather than the writers' DNS labels.
func (in Instance) ValidateRead(maxMetadata int) error {
	if err := in.Ref().Validate(); err != nil {
		return err
	}
	return in.validateFields(maxMetadata, false)
}

func (in Instance) validate(maxMetadata int, write bool) error {
	if err := in.Ref().ValidateWritten(); err != nil {
		return err
	}
	return in.validateFields(maxMetadata, write)
}

// validateFields checks every field but the names and the ID.
func (in Instance) validateFields(maxMetadata int, write bool) error {
	if err := validateAddress(in.Address, write); err != nil {
		return err
	}
	if err := validateTransport(in.Transport); err != nil {
		return err
	}
	if err := validateMetadata(in.Metadata, maxMetadata, write); err != nil {
		return err
	}
	switch in.Status {
	case "", StatusServing, StatusDraining:
	default:
		return fieldError(ErrInvalid, "status", string(in.Status), `must be "serving" or "draining"`)
	}
	if in.Check != nil {
		if err := in.Check.Validate(); err != nil {
			return err
		}
		if write {
			return in.Check.validateUnused()
		}
	}
	return nil
}

// ValidateAddress checks that addr is host:port (port 1-65535) or an
// absolute URL with a host, with no spaces or control characters, and a
// host name DNS can carry.
func ValidateAddress(addr string) error { return validateAddress(addr, true) }

// validateAddress is ValidateAddress; a reader (write false) accepts host
// names longer than DNS carries, which older writers stored.
func validateAddress(addr string, write bool) error {
	const rule = "must be host:port (port 1-65535) or a URL like nats://host:4222"
	if addr == "" {
		return fieldError(ErrInvalidAddress, "address", addr, "is required; "+rule)
	}
	if len(addr) > MaxAddressLength {
		return fieldError(ErrInvalidAddress, "address", addr, fmt.Sprintf("is longer than %d bytes", MaxAddressLength))
	}
	for _, r := range addr {
		if r == utf8.RuneError || unicode.IsSpace(r) || unicode.IsControl(r) {
			return fieldError(ErrInvalidAddress, "address", addr, "must not contain spaces, control characters or invalid UTF-8")
		}
	}
	if strings.Contains(addr, "://") {
		u, err := url.Parse(addr)
		if err != nil || u.Scheme == "" || (u.Host == "" && u.Path == "") {
			return fieldError(ErrInvalidAddress, "address", addr, rule)
		}
		if !write {
			return nil
		}
		return checkURLAddress(addr, u)
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fieldError(ErrInvalidAddress, "address", addr, rule)
	}
	if !validPort(port) {
		return fieldError(ErrInvalidAddress, "address", addr, rule)
	}
	if !write {
		return nil
	}
	if err := checkPortForm(addr, port); err != nil {
		return err
	}
	if ip, err := netip.ParseAddr(host); strings.HasPrefix(addr, "[") && (err != nil || !ip.Is6()) {
		return fieldError(ErrInvalidAddress, "address", addr, "has brackets around something other than an IPv6 address: write [2001:db8::1]:80, 10.0.0.1:80 or host:80")
	}
	return checkHostName(addr, host)
}

// checkURLAddress checks, for a writer, what a URL address holds: no
// credentials (every reader sees an address), a host when it has a port
// or no path, a port of digits 1-65535, and a host as checkHostName
// wants it.
func checkURLAddress(addr string, u *url.URL) error {
	switch {
	case u.User != nil:
		return fieldError(ErrInvalidAddress, "address", addr, "carries credentials (user:password@): every reader of the registry sees an address; give the service its credentials another way")
	case u.Host == "" && strings.Trim(u.Path, "/") == "":
		return fieldError(ErrInvalidAddress, "address", addr, "has neither a host nor a path: write a URL like nats://host:4222 or unix:///run/app.sock")
	case u.Host != "" && u.Hostname() == "":
		return fieldError(ErrInvalidAddress, "address", addr, "has a port but no host")
	case u.Host != "" && (strings.HasSuffix(u.Host, ":") || u.Port() != "" && !validPort(u.Port())):
		return fieldError(ErrInvalidAddress, "address", addr, "has a port that is not a number 1-65535")
	}
	if err := checkPortForm(addr, u.Port()); err != nil {
		return err
	}
	return checkHostName(addr, u.Hostname())
}

// checkPortForm refuses, for a writer, a port written with leading zeros:
// one endpoint written two ways (h:080, h:80) would be two to every reader
// that compares addresses, and some read a leading 0 as octal.
func checkPortForm(addr, port string) error {
	if len(port) > 1 && port[0] == '0' {
		return fieldError(ErrInvalidAddress, "address", addr, fmt.Sprintf("has a port with leading zeros: write %s", strings.TrimLeft(port, "0")))
	}
	return nil
}

// checkHostName refuses a host of addr that is neither an IP address a
// client can connect to (an IPv6 zone is an interface's name; see
// IPProblem) nor a host name resolvers and Beacon's DNS carry (see
// HostNameProblem). An empty host (a URL of a path) passes.
func checkHostName(addr, host string) error {
	if ip, err := netip.ParseAddr(host); host == "" || err == nil { // net.ParseIP allocates
		if z := ip.Zone(); z != "" && strings.Trim(z, "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_.-") != "" {
			return fieldError(ErrInvalidAddress, "address", addr, fmt.Sprintf("has the IPv6 zone %q: a zone is an interface's name (eth0)", z))
		}
		if why := IPProblem(ip); host != "" && why != "" {
			return fieldError(ErrInvalidAddress, "address", addr, why)
		}
		return nil
	}
	if why := HostNameProblem(host); why != "" {
		return fieldError(ErrInvalidAddress, "address", addr, why)
	}
	return nil
}

// IPProblem says why ip is no address of one host that a client can
// connect to, or "" when it is: not the unspecified address (0.0.0.0,
// ::, a listener's "every interface"), a broadcast or a multicast
// address. Endpoints of Kubernetes refuse the same.
func IPProblem(ip netip.Addr) string {
	ip = ip.Unmap()
	switch {
	case ip.IsUnspecified():
		return fmt.Sprintf("is the unspecified address %s, which a listener uses for every interface and a client cannot reach: register the address clients connect to (the host's IP, or 127.0.0.1 on one host)", ip)
	case ip == netip.AddrFrom4([4]byte{255, 255, 255, 255}):
		return "is the broadcast address 255.255.255.255: register the address of one host"
	case ip.IsMulticast():
		return fmt.Sprintf("is the multicast address %s: register the address of one host", ip)
	}
	return ""
}

// HostNameProblem says why host, a host name (not an IP address), is
// not one that resolvers (Go's among them) and Beacon's DNS can carry, or
// "" when it is: labels between dots (one trailing dot allowed) of 1 to
// 63 letters, digits, '-' (never first or last in a label) and '_' (for
// names like _acme), 253 bytes at most in all (RFC 1035, RFC 1123). An
// internationalized name is written in its ASCII form (xn--…).
func HostNameProblem(host string) string {
	name := strings.TrimSuffix(host, ".")
	for label := range strings.SplitSeq(name, ".") {
		switch {
		case label == "":
			return "has an empty label (two dots in a row, or a leading dot) in its host name"
		case len(label) > 63:
			return fmt.Sprintf("has a host name label of %d bytes (%.20s…): DNS carries at most 63 between dots", len(label), label)
		case label[0] == '-' || label[len(label)-1] == '-':
			return fmt.Sprintf("has a host name label %q that begins or ends with '-': resolvers refuse it", label)
		}
		for _, r := range label {
			switch {
			case 'a' <= r && r <= 'z', 'A' <= r && r <= 'Z', '0' <= r && r <= '9', r == '-', r == '_':
			case r >= utf8.RuneSelf:
				return fmt.Sprintf("has %q in its host name: write an internationalized name in its ASCII form (xn--…, as idn2 or golang.org/x/net/idna give it)", r)
			default:
				return fmt.Sprintf("has %q in its host name: a host name is letters, digits, '-' and '_' between dots", r)
			}
		}
	}
	if len(name) > 253 {
		return fmt.Sprintf("has a host name of %d bytes: DNS carries at most 253", len(name))
	}
	if last := name[strings.LastIndexByte(name, '.')+1:]; strings.Trim(last, "0123456789") == "" ||
		strings.HasPrefix(strings.ToLower(last), "0x") && strings.Trim(strings.ToLower(last[2:]), "0123456789abcdef") == "" {
		return fmt.Sprintf("is a number where a host name ends (%s): not an IP address as written (four numbers 0-255, no leading zeros) nor a host name, and resolvers read it differently (glibc as an IP address, Go as a name)", host)
	}
	return ""
}

// validPort reports whether port is a port number 1-65535 written in
// decimal digits alone (strconv.Atoi would take "+80").
func validPort(port string) bool {
	if port == "" || len(port) > 5 || strings.Trim(port, "0123456789") != "" {
		return false
	}
	p, _ := strconv.Atoi(port)
	return p >= 1 && p <= 65535
}

func validateTransport(t string) error {
	if len(t) > 32 {
		return fieldError(ErrInvalid, "transport", t, "must be at most 32 characters")
	}
	for i := 0; i < len(t); i++ {
		c := t[i]
		if !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '-' || c == '+' || c == '.') {
			return fieldError(ErrInvalid, "transport", t, "must be lower-case letters, digits, '-', '+' or '.', like grpc or http")
		}
	}
	return nil
}

// MetadataSize is the size metadata counts against the limit: the sum of
// the lengths of its keys and values.
func MetadataSize(md map[string]string) int {
	n := 0
	for k, v := range md {
		n += len(k) + len(v)
	}
	return n
}

// ValidateMetadata checks keys (non-empty, at most 253 bytes, printable) and
// values (valid UTF-8 without control characters: a newline or NUL breaks
// every line-based consumer, DNS TXT readers and logs), and that the total
// size is at most max bytes.
func ValidateMetadata(md map[string]string, max int) error { return validateMetadata(md, max, true) }

// validateMetadata is ValidateMetadata; a reader (write false) accepts
// control characters in values.
func validateMetadata(md map[string]string, max int, write bool) error {
	if n := MetadataSize(md); n > max {
		return fieldError(ErrMetadataTooLarge, "metadata", fmt.Sprintf("%d bytes", n),
			fmt.Sprintf("keys and values may total at most %d bytes; store large data elsewhere and put a reference in metadata", max))
	}
	for k, v := range md {
		if k == "" || len(k) > MaxMetadataKeyLength || !utf8.ValidString(k) || strings.ContainsFunc(k, isBadKeyRune) {
			return fieldError(ErrInvalidMetadata, "metadata key", k, "must be 1-253 bytes of printable UTF-8 without spaces")
		}
		if !utf8.ValidString(v) {
			return fieldError(ErrInvalidMetadata, "metadata value for "+k, v, "must be valid UTF-8")
		}
		if write && strings.ContainsFunc(v, unicode.IsControl) {
			return fieldError(ErrInvalidMetadata, "metadata value for "+k, v,
				"must not contain control characters (newline, tab, NUL...): put multi-line or binary data in one line, e.g. as base64")
		}
	}
	return nil
}

func isBadKeyRune(r rune) bool { return unicode.IsSpace(r) || unicode.IsControl(r) }

// MarshalJSON is the stored form of an instance.
func (in Instance) MarshalJSON() ([]byte, error) {
	type plain Instance
	if in.Status == "" {
		in.Status = StatusServing
	}
	return json.Marshal(plain(in))
}

// UnmarshalInstance decodes and validates a stored value. Unknown fields are
// ignored so that newer writers can add fields; a value that is not an
// instance gives an error.
func UnmarshalInstance(data []byte) (Instance, error) {
	type plain Instance
	var p plain
	if err := ValidateJSONText(data); err != nil {
		return Instance{}, fmt.Errorf("beacon: decode instance: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&p); err != nil {
		return Instance{}, fmt.Errorf("beacon: decode instance: %w", err)
	}
	if dec.More() {
		return Instance{}, fmt.Errorf("beacon: decode instance: trailing data after the JSON object")
	}
	in := Instance(p)
	if in.Status == "" {
		in.Status = StatusServing
	}
	if err := in.ValidateStored(1 << 20); err != nil {
		return Instance{}, fmt.Errorf("beacon: decode instance: %w", err)
	}
	return in, nil
}
