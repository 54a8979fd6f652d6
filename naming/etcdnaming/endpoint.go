package etcdnaming

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
)

// Sentinel errors; match them with errors.Is.
var (
	// ErrInvalidTarget reports a target that names no key prefix, or a
	// gRPC target in another form than etcd:///<target>.
	ErrInvalidTarget = errors.New("etcdnaming: invalid target")
	// ErrKeyOutsideTarget reports an update whose key does not start with
	// "<target>/".
	ErrKeyOutsideTarget = errors.New("etcdnaming: key outside the target")
	// ErrInvalidEndpoint reports an update that cannot be written: no
	// address, metadata that is not JSON-encodable, an unknown operation,
	// or a key updated twice in one call.
	ErrInvalidEndpoint = errors.New("etcdnaming: invalid endpoint")
	// ErrInvalidValue reports a stored value that is not an endpoint: not
	// JSON, not an object, or without Addr. Resolvers and List skip such
	// values (logged and counted).
	ErrInvalidValue = errors.New("etcdnaming: invalid stored endpoint")
	// ErrNoTransactions reports a multi-key update on a store without
	// store.Transactor: it could not be atomic, so nothing is written.
	ErrNoTransactions = errors.New("etcdnaming: the store has no multi-key transactions")
	// ErrNoEndpoints is reported to gRPC while the target has no endpoint,
	// so that RPCs fail fast instead of hanging.
	ErrNoEndpoints = errors.New("etcdnaming: no endpoints")
	// ErrStale is reported to gRPC while the store is unreachable or the
	// watch broke: the channel keeps the last known endpoints until the
	// resolver has re-listed.
	ErrStale = errors.New("etcdnaming: endpoint list may be stale")
	// ErrInvalidConfig reports a bad argument to NewBuilder or NewManager.
	ErrInvalidConfig = errors.New("etcdnaming: invalid configuration")
)

// errNoAddr tells a value without an address from one that is not JSON.
var errNoAddr = errors.New("no Addr")

// Operation is the kind of an Update: Add or Delete. The values are those
// of etcd's endpoints.Operation (and grpc ≤1.29 naming.Operation).
type Operation uint8

const (
	// Add writes (creates or replaces) an endpoint.
	Add Operation = iota
	// Delete removes an endpoint.
	Delete
)

// Endpoint is one endpoint of a target, as etcd's endpoints.Endpoint.
type Endpoint struct {
	// Addr is the address to dial, host:port for gRPC.
	Addr string
	// Metadata is any JSON-encodable value. Read back, it is the generic
	// JSON form (map[string]any, []any, float64, string, bool or nil).
	Metadata any
}

// wire is the stored value: the JSON of etcd's endpoints/internal.Update
// (itself a superset of grpc ≤1.29 naming.Update), field names without
// tags: {"Op":0,"Addr":"1.2.3.4:50051","Metadata":null}.
type wire struct {
	Op       Operation
	Addr     string
	Metadata any
}

// Encode returns the value etcd's endpoint manager stores for ep, byte for
// byte: {"Op":0,"Addr":"…","Metadata":…}.
func Encode(ep Endpoint) ([]byte, error) {
	if ep.Addr == "" {
		return nil, fmt.Errorf("%w: Addr is empty; set it to the address to dial, host:port", ErrInvalidEndpoint)
	}
	v, err := json.Marshal(wire{Op: Add, Addr: ep.Addr, Metadata: ep.Metadata})
	if err != nil {
		return nil, fmt.Errorf("%w: metadata of %s is not JSON-encodable: %w", ErrInvalidEndpoint, ep.Addr, err)
	}
	return v, nil
}

// decoded is a stored endpoint with its metadata also as compact JSON text
// (comparable, for gRPC attributes).
type decoded struct {
	ep           Endpoint
	metadataJSON string
}

func (d decoded) equal(o decoded) bool {
	return d.ep.Addr == o.ep.Addr && d.metadataJSON == o.metadataJSON
}

// Decode reads a stored value the way etcd's endpoint manager does (field
// names match case-insensitively; Op is ignored: a stored endpoint is
// present). A value that is not a JSON object, or has no Addr, gives an
// error matching ErrInvalidValue.
func Decode(value []byte) (Endpoint, error) {
	d, err := decode(value)
	return d.ep, err
}

func decode(value []byte) (decoded, error) {
	var w struct {
		Op       Operation // decoded as etcd does (a bad Op fails), then ignored
		Addr     string
		Metadata json.RawMessage
	}
	if err := json.Unmarshal(value, &w); err != nil {
		return decoded{}, fmt.Errorf("%w: %w (value %s)", ErrInvalidValue, err, quote(value))
	}
	if w.Addr == "" {
		return decoded{}, fmt.Errorf("%w: %w (value %s)", ErrInvalidValue, errNoAddr, quote(value))
	}
	d := decoded{ep: Endpoint{Addr: w.Addr}, metadataJSON: "null"}
	if len(w.Metadata) > 0 && string(w.Metadata) != "null" {
		if err := json.Unmarshal(w.Metadata, &d.ep.Metadata); err != nil {
			// Unreachable: the outer Unmarshal validated it.
			return decoded{}, fmt.Errorf("%w: metadata: %w", ErrInvalidValue, err)
		}
		var buf bytes.Buffer
		if err := json.Compact(&buf, w.Metadata); err == nil {
			d.metadataJSON = buf.String()
		}
	}
	return d, nil
}

// quote renders a value for an error message, shortened.
func quote(v []byte) string {
	const max = 120
	if len(v) > max {
		return fmt.Sprintf("%q…(%d bytes)", v[:max], len(v))
	}
	return fmt.Sprintf("%q", v)
}
