package beacon

import (
	"bytes"
	"encoding/json"
	"fmt"
	"maps"
	"net"
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
}

// Ref returns the instance's name.
func (in Instance) Ref() Ref {
	return Ref{Namespace: in.Namespace, Component: in.Component, Endpoint: in.Endpoint, ID: in.ID}
}

// Serving reports whether the instance takes new work.
func (in Instance) Serving() bool { return in.Status == "" || in.Status == StatusServing }

// Clone returns a deep copy.
func (in Instance) Clone() Instance {
	in.Metadata = maps.Clone(in.Metadata)
	return in
}

// Equal reports whether two instances are the same in every field.
func (in Instance) Equal(o Instance) bool {
	return in.Namespace == o.Namespace && in.Component == o.Component && in.Endpoint == o.Endpoint &&
		in.ID == o.ID && in.Address == o.Address && in.Transport == o.Transport &&
		in.Status == o.Status && in.RegisteredAt.Equal(o.RegisteredAt) && maps.Equal(in.Metadata, o.Metadata)
}

// Validate checks every field against the rules of the key layout and the
// limits above, with the default metadata limit.
func (in Instance) Validate() error { return in.ValidateWith(DefaultMaxMetadataSize) }

// ValidateWith is Validate with a caller-chosen metadata limit.
func (in Instance) ValidateWith(maxMetadata int) error {
	if err := in.Ref().Validate(); err != nil {
		return err
	}
	if err := ValidateAddress(in.Address); err != nil {
		return err
	}
	if err := validateTransport(in.Transport); err != nil {
		return err
	}
	if err := ValidateMetadata(in.Metadata, maxMetadata); err != nil {
		return err
	}
	switch in.Status {
	case "", StatusServing, StatusDraining:
	default:
		return fieldError(ErrInvalid, "status", string(in.Status), `must be "serving" or "draining"`)
	}
	return nil
}

// ValidateAddress checks that addr is host:port (port 1-65535) or an
// absolute URL with a host, with no spaces or control characters.
func ValidateAddress(addr string) error {
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
		return nil
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil || host == "" {
		return fieldError(ErrInvalidAddress, "address", addr, rule)
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return fieldError(ErrInvalidAddress, "address", addr, rule)
	}
	return nil
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
// values (valid UTF-8), and that the total size is at most max bytes.
func ValidateMetadata(md map[string]string, max int) error {
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
	if err := in.ValidateWith(1 << 20); err != nil {
		return Instance{}, fmt.Errorf("beacon: decode instance: %w", err)
	}
	return in, nil
}
