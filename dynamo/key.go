package dynamo

import (
	"errors"
	"fmt"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/clip"
)

// The buckets Beacon reads, as key prefixes. Dynamo's etcd keys have no
// leading '/'.
const (
	// Root is the prefix of every bucket Dynamo writes: one store watch of
	// it delivers instances and model cards in one ordered stream.
	Root = "v1/"
	// InstancesPrefix holds the endpoint instances.
	InstancesPrefix = "v1/instances/"
	// ModelsPrefix holds the model deployment cards.
	ModelsPrefix = "v1/mdc/"
)

// Kind is what an entry holds.
type Kind uint8

const (
	// KindEndpoint is an endpoint instance (v1/instances/, "type":"Endpoint").
	KindEndpoint Kind = iota + 1
	// KindModel is a model deployment card (v1/mdc/, "type":"Model").
	KindModel
)

func (k Kind) String() string {
	switch k {
	case KindEndpoint:
		return "Endpoint"
	case KindModel:
		return "Model"
	}
	return "unknown"
}

// Key is a parsed key of an instance or a model card.
type Key struct {
	Kind       Kind
	Namespace  string
	Component  string
	Endpoint   string
	InstanceID uint64
	// Suffix is a model card's suffix (a LoRA's slug), "" for none; an
	// instance has none.
	Suffix string
}

// Ref returns the Beacon ref of the instance the key is about: its names,
// and its instance ID as 16 hex digits.
func (k Key) Ref() beacon.Ref {
	return beacon.Ref{Namespace: k.Namespace, Component: k.Component, Endpoint: k.Endpoint, ID: beacon.FormatID(k.InstanceID)}
}

// String returns the key as Dynamo writes it: its bucket, the names, the
// instance ID in unpadded lower-case hex, and the suffix if any.
func (k Key) String() string {
	prefix := InstancesPrefix
	if k.Kind == KindModel {
		prefix = ModelsPrefix
	}
	s := prefix + k.Namespace + "/" + k.Component + "/" + k.Endpoint + "/" + strconv.FormatUint(k.InstanceID, 16)
	if k.Suffix != "" {
		s += "/" + k.Suffix
	}
	return s
}

// InstanceKey returns the key at which Dynamo writes the instance ref
// names (unpadded hex): where to look for it with etcdctl. It does not
// validate ref.
func InstanceKey(ref beacon.Ref) string {
	id, _ := strconv.ParseUint(ref.ID, 16, 64)
	return Key{Kind: KindEndpoint, Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint, InstanceID: id}.String()
}

// ModelsKeyPrefix returns the prefix under which Dynamo writes the model
// cards of the instance ref names (the card without suffix is the prefix
// itself without its trailing '/').
func ModelsKeyPrefix(ref beacon.Ref) string {
	id, _ := strconv.ParseUint(ref.ID, 16, 64)
	return Key{Kind: KindModel, Namespace: ref.Namespace, Component: ref.Component, Endpoint: ref.Endpoint, InstanceID: id}.String() + "/"
}

// ErrNotServed reports a key Dynamo writes that is no instance and no
// model card (event channels and sources, claims, anything else under
// v1/): readers skip it without a word.
var ErrNotServed = errors.New("dynamo: not an instance or a model card")

// ErrMalformed matches every *EntryError: an entry Beacon cannot serve.
var ErrMalformed = errors.New("dynamo: malformed entry")

// EntryError is an entry Beacon cannot serve: its key and what was wrong.
type EntryError struct {
	Key string
	Err error
}

func (e *EntryError) Error() string {
	return fmt.Sprintf("dynamo: entry %q: %v", shorten(e.Key), e.Err)
}

// Unwrap returns what was wrong.
func (e *EntryError) Unwrap() error { return e.Err }

// Is matches ErrMalformed.
func (e *EntryError) Is(target error) bool { return target == ErrMalformed }

func entryErrorf(key, format string, args ...any) error {
	return &EntryError{Key: key, Err: fmt.Errorf(format, args...)}
}

// shorten keeps messages readable when a key or value is huge.
func shorten(s string) string { return clip.String(s, 200) }

// ParseKey parses the key of an instance or a model card. A key elsewhere
// under Root gives ErrNotServed; anything else an *EntryError.
func ParseKey(key string) (Key, error) {
	var (
		k    Key
		rest string
		ok   bool
	)
	if rest, ok = strings.CutPrefix(key, InstancesPrefix); ok {
		k.Kind = KindEndpoint
	} else if rest, ok = strings.CutPrefix(key, ModelsPrefix); ok {
		k.Kind = KindModel
	} else if strings.HasPrefix(key, Root) {
		return Key{}, ErrNotServed
	} else {
		return Key{}, entryErrorf(key, "is outside Dynamo's buckets (%s..., %s...)", InstancesPrefix, ModelsPrefix)
	}
	parts := strings.Split(rest, "/")
	switch {
	case k.Kind == KindEndpoint && len(parts) != 4:
		return Key{}, entryErrorf(key, "has %d segments after %s: want namespace/component/endpoint/instance_id", len(parts), InstancesPrefix)
	case k.Kind == KindModel && (len(parts) < 4 || len(parts) > 5):
		return Key{}, entryErrorf(key, "has %d segments after %s: want namespace/component/endpoint/instance_id[/suffix]", len(parts), ModelsPrefix)
	case k.Kind == KindModel && len(parts) == 5 && parts[4] == "":
		return Key{}, entryErrorf(key, "has an empty model suffix")
	}
	k.Namespace, k.Component, k.Endpoint = parts[0], parts[1], parts[2]
	if err := beacon.ValidateReadNamespace(k.Namespace); err != nil {
		return Key{}, &EntryError{Key: key, Err: err}
	}
	if err := beacon.ValidateReadLabel("component", k.Component); err != nil {
		return Key{}, &EntryError{Key: key, Err: err}
	}
	if err := beacon.ValidateReadLabel("endpoint", k.Endpoint); err != nil {
		return Key{}, &EntryError{Key: key, Err: err}
	}
	id, err := parseHexID(parts[3])
	if err != nil {
		return Key{}, &EntryError{Key: key, Err: err}
	}
	k.InstanceID = id
	if len(parts) == 5 {
		k.Suffix = parts[4]
	}
	return k, nil
}

// parseHexID reads an instance ID as Dynamo writes it in keys: lower-case
// hex, unpadded (leading zeros are read too), at most 2^64-1.
func parseHexID(s string) (uint64, error) {
	if s == "" {
		return 0, errors.New("instance_id is empty: want lower-case hex such as 2a")
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return 0, fmt.Errorf("instance_id %q is not lower-case hex (such as 2a)", shorten(s))
		}
	}
	id, err := strconv.ParseUint(s, 16, 64)
	if err != nil {
		return 0, fmt.Errorf("instance_id %q is above 2^64-1", shorten(s))
	}
	return id, nil
}
