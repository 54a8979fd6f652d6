package dynamo

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon"
)

// Metadata keys of the instances Decode returns.
const (
	// MetaInstanceID is the instance ID as Dynamo's value has it: a
	// decimal number (the Beacon ID is the same number in 16 hex digits).
	MetaInstanceID = "dynamo.instance_id"
	// MetaTarget is the string of the value's transport: "host:port/path"
	// (tcp), the URL (http), the subject (nats_tcp): what Dynamo's
	// frontends dial.
	MetaTarget = "dynamo.target"
	// MetaKey is the key the instance was read from.
	MetaKey = "dynamo.key"
	// MetaDeviceType is the value's device_type, when it has one (a
	// string as it is, anything else as compact JSON).
	MetaDeviceType = "dynamo.device_type"
	// MetaCodec is the value's request_plane_codec, when it has one.
	MetaCodec = "dynamo.request_plane_codec"
	// MetaModels lists the display names of the instance's model cards,
	// sorted, comma separated (Catalog joins them).
	MetaModels = "dynamo.models"
)

// Entry is one decoded key/value: an instance or a model card.
type Entry struct {
	// Key is the key as stored.
	Key    string
	Parsed Key
	// Instance is the instance of an Endpoint entry.
	Instance beacon.Instance
	// Model is the display name of a Model entry's card.
	Model string
}

// Decode reads one stored key/value. Keys in other buckets under Root give
// ErrNotServed; every other failure is an *EntryError naming the key and
// what was wrong. Fields the value has that Beacon does not read are
// ignored, so that values Dynamo's newer releases write still decode.
func Decode(key string, value []byte) (Entry, error) {
	k, err := ParseKey(key)
	if err != nil {
		return Entry{}, err
	}
	fields, err := readObject(value)
	if err != nil {
		return Entry{}, &EntryError{Key: key, Err: err}
	}
	typ, err := stringField(fields, "type")
	if err != nil {
		return Entry{}, &EntryError{Key: key, Err: err}
	}
	switch {
	case typ == k.Kind.String():
	case typ == KindEndpoint.String() || typ == KindModel.String() || typ == "EventChannel" || typ == "EventSource":
		return Entry{}, entryErrorf(key, "holds a value of type %q, which does not belong under %s", typ, bucketOf(k.Kind))
	default:
		return Entry{}, entryErrorf(key, "has unknown type %q: Beacon reads Endpoint values under %s and Model values under %s",
			shorten(typ), InstancesPrefix, ModelsPrefix)
	}
	if err := checkIdentity(k, fields); err != nil {
		return Entry{}, &EntryError{Key: key, Err: err}
	}
	e := Entry{Key: key, Parsed: k}
	if k.Kind == KindModel {
		e.Model, err = modelName(fields)
	} else {
		e.Instance, err = instanceOf(k, key, fields)
	}
	if err != nil {
		return Entry{}, &EntryError{Key: key, Err: err}
	}
	return e, nil
}

func bucketOf(k Kind) string {
	if k == KindModel {
		return ModelsPrefix
	}
	return InstancesPrefix
}

// readObject reads a value that must be one JSON object, keeping its
// members' raw values by name. Names are matched exactly, as Dynamo's
// reader (serde) matches them; a member given twice is refused (serde
// refuses it for the fields it reads).
func readObject(value []byte) (map[string]json.RawMessage, error) {
	if err := beacon.ValidateJSONText(value); err != nil {
		return nil, fmt.Errorf("value is not JSON text: %w", err)
	}
	dec := json.NewDecoder(bytes.NewReader(value))
	tok, err := dec.Token()
	if err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	if d, ok := tok.(json.Delim); !ok || d != '{' {
		return nil, fmt.Errorf("value is not a JSON object (starts with %v)", tok)
	}
	fields := make(map[string]json.RawMessage)
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fmt.Errorf("value is not JSON: %w", err)
		}
		name, _ := tok.(string) // object keys are strings
		var raw json.RawMessage
		if err := dec.Decode(&raw); err != nil {
			return nil, fmt.Errorf("value is not JSON: member %q: %w", shorten(name), err)
		}
		if _, dup := fields[name]; dup {
			return nil, fmt.Errorf("value gives %q twice", shorten(name))
		}
		fields[name] = raw
	}
	if _, err := dec.Token(); err != nil {
		return nil, fmt.Errorf("value is not JSON: %w", err)
	}
	if _, err := dec.Token(); err == nil {
		return nil, errors.New("value has data after its JSON object")
	}
	return fields, nil
}

// stringField returns the member name, which must be a JSON string.
func stringField(fields map[string]json.RawMessage, name string) (string, error) {
	raw, ok := fields[name]
	if !ok || isNull(raw) {
		return "", fmt.Errorf("value has no %q", name)
	}
	var s string
	if err := json.Unmarshal(raw, &s); err != nil {
		return "", fmt.Errorf("value's %q is not a string: %s", name, shorten(string(raw)))
	}
	return s, nil
}

func isNull(raw json.RawMessage) bool { return string(raw) == "null" }

// checkIdentity checks that the value's names and instance ID are its
// key's.
func checkIdentity(k Key, fields map[string]json.RawMessage) error {
	for _, f := range [...]struct{ name, want string }{
		{"namespace", k.Namespace}, {"component", k.Component}, {"endpoint", k.Endpoint},
	} {
		got, err := stringField(fields, f.name)
		if err != nil {
			return err
		}
		if got != f.want {
			return fmt.Errorf("value's %s %q is not the key's %q", f.name, shorten(got), f.want)
		}
	}
	id, err := instanceID(fields["instance_id"])
	if err != nil {
		return err
	}
	if id != k.InstanceID {
		return fmt.Errorf("value's instance_id %d is not the key's %x (%d)", id, k.InstanceID, k.InstanceID)
	}
	return nil
}

// instanceID reads instance_id, a JSON number that is a u64: a whole
// number in [0, 2^64-1], written without fraction or exponent (serde
// refuses 42.0 and 4.2e1 for a u64, and so does Beacon).
func instanceID(raw json.RawMessage) (uint64, error) {
	s := string(raw)
	switch {
	case raw == nil || s == "null":
		return 0, errors.New(`value has no "instance_id"`)
	case strings.HasPrefix(s, "-"):
		return 0, fmt.Errorf("value's instance_id %s is negative: want a whole number in [0, 2^64-1]", shorten(s))
	case s == "" || s[0] < '0' || s[0] > '9':
		return 0, fmt.Errorf("value's instance_id %s is not a number", shorten(s))
	case strings.ContainsAny(s, ".eE"):
		return 0, fmt.Errorf("value's instance_id %s is not a whole number written as one (no fraction, no exponent)", shorten(s))
	}
	id, err := strconv.ParseUint(s, 10, 64)
	if err != nil {
		return 0, fmt.Errorf("value's instance_id %s is above 2^64-1", shorten(s))
	}
	return id, nil
}

// modelName reads a Model value's card: the display name of its
// card_json.
func modelName(fields map[string]json.RawMessage) (string, error) {
	raw, ok := fields["card_json"]
	if !ok || isNull(raw) {
		return "", errors.New(`value has no "card_json"`)
	}
	card, err := readObject(raw)
	if err != nil {
		return "", fmt.Errorf("card_json: %w", err)
	}
	name, err := stringField(card, "display_name")
	if err != nil {
		return "", fmt.Errorf("card_json: %w", err)
	}
	if name == "" || strings.ContainsRune(name, ',') || strings.ContainsFunc(name, isControl) {
		return "", fmt.Errorf("card_json's display_name %q is empty or holds a comma or a control character", shorten(name))
	}
	return name, nil
}

func isControl(r rune) bool { return r < 0x20 || r == 0x7f || (r >= 0x80 && r < 0xa0) }

// instanceOf builds the instance of an Endpoint value.
func instanceOf(k Key, key string, fields map[string]json.RawMessage) (beacon.Instance, error) {
	raw, ok := fields["transport"]
	if !ok || isNull(raw) {
		return beacon.Instance{}, errors.New(`value has no "transport"`)
	}
	addr, transport, target, err := readTransport(raw)
	if err != nil {
		return beacon.Instance{}, err
	}
	ref := k.Ref()
	in := beacon.Instance{
		Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint, ID: ref.ID,
		Address: addr, Transport: transport, Status: beacon.StatusServing,
		Metadata: map[string]string{
			MetaInstanceID: strconv.FormatUint(k.InstanceID, 10),
			MetaTarget:     target,
			MetaKey:        key,
		},
	}
	for name, meta := range map[string]string{"device_type": MetaDeviceType, "request_plane_codec": MetaCodec} {
		if v, ok := optional(fields[name]); ok {
			in.Metadata[meta] = v
		}
	}
	// No size limit: Beacon's limit bounds what its writers store, and
	// the value's own fields are bounded by the store's value size.
	if err := in.ValidateRead(1 << 30); err != nil {
		return beacon.Instance{}, err
	}
	return in, nil
}

// optional reads an optional member Beacon copies into metadata: absent
// or null is none, a string is itself, anything else its compact JSON.
func optional(raw json.RawMessage) (string, bool) {
	if raw == nil || isNull(raw) {
		return "", false
	}
	var s string
	if json.Unmarshal(raw, &s) == nil {
		return s, true
	}
	var buf bytes.Buffer
	if json.Compact(&buf, raw) != nil {
		return "", false
	}
	return buf.String(), true
}

// readTransport reads the externally tagged transport: exactly one of
// tcp, http and nats_tcp, whose value is a string.
func readTransport(raw json.RawMessage) (addr, transport, target string, err error) {
	obj, err := readObject(raw)
	if err != nil {
		return "", "", "", fmt.Errorf("transport: %w", err)
	}
	if len(obj) != 1 {
		return "", "", "", fmt.Errorf("transport has %d members: want exactly one of tcp, http, nats_tcp", len(obj))
	}
	for kind, v := range obj {
		if err := json.Unmarshal(v, &target); err != nil {
			return "", "", "", fmt.Errorf("transport %q is not a string: %s", shorten(kind), shorten(string(v)))
		}
		if target == "" {
			return "", "", "", fmt.Errorf("transport %q is empty", kind)
		}
		switch kind {
		case "tcp":
			addr, err = tcpAddress(target)
			transport = "tcp"
		case "http":
			addr, transport, err = httpAddress(target)
		case "nats_tcp":
			addr, transport = "nats:///"+target, "nats"
		default:
			err = fmt.Errorf("transport %q is unknown: Beacon reads tcp, http and nats_tcp", shorten(kind))
		}
	}
	return addr, transport, target, err
}

// tcpAddress reads a TCP request plane target, "host:port/endpoint-path".
func tcpAddress(target string) (string, error) {
	hostport, _, _ := strings.Cut(target, "/")
	host, port, err := net.SplitHostPort(hostport)
	if err != nil || host == "" {
		return "", fmt.Errorf("transport tcp %q is not host:port/path", shorten(target))
	}
	if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
		return "", fmt.Errorf("transport tcp %q has no port in 1-65535", shorten(target))
	}
	return hostport, nil
}

// httpAddress reads an HTTP request plane target, a URL such as
// http://host:port/v1/rpc/endpoint: host:port (the scheme's port if the
// URL has none) and the scheme.
func httpAddress(target string) (addr, scheme string, err error) {
	u, err := url.Parse(target)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Hostname() == "" {
		return "", "", fmt.Errorf("transport http %q is not an http:// or https:// URL with a host", shorten(target))
	}
	port := u.Port()
	switch {
	case port != "":
		if p, err := strconv.Atoi(port); err != nil || p < 1 || p > 65535 {
			return "", "", fmt.Errorf("transport http %q has no port in 1-65535", shorten(target))
		}
	case u.Scheme == "https":
		port = "443"
	default:
		port = "80"
	}
	return net.JoinHostPort(u.Hostname(), port), u.Scheme, nil
}
