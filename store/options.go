package store

import (
	"fmt"
	"sync"
	"time"
	"unicode/utf8"
)

// Limits every backend enforces, so that data written through one backend
// fits every other.
const (
	// MaxKeySize is the longest key, in bytes.
	MaxKeySize = 1 << 10
	// MaxValueSize is the largest value, in bytes (512 KiB). It leaves room
	// below etcd's 1.5 MiB request limit and NATS's 1 MiB payload limit.
	MaxValueSize = 512 << 10
	// MinLeaseTTL is the shortest lease.
	MinLeaseTTL = time.Second
	// MaxLeaseTTL is the longest lease.
	MaxLeaseTTL = 24 * time.Hour
)

// WriteOption modifies one Create, Put or Update.
type WriteOption func(*WriteOptions)

// WriteOptions is the result of applying WriteOptions; backends read it.
type WriteOptions struct {
	// Lease binds the key to a lease (NoLease by default).
	Lease LeaseID
	// KeepLease keeps the key bound to the lease it has (see KeepLease);
	// Lease is then ignored.
	KeepLease bool
}

// WithLease binds the written key to the lease: when the lease ends, the key
// is deleted. Writing to a lease that has ended fails with ErrLeaseNotFound.
func WithLease(id LeaseID) WriteOption {
	return func(o *WriteOptions) { o.Lease = id }
}

// KeepLease writes the key without changing the lease it is bound to
// (etcd's ignore_lease): for an Update of a key whose lease belongs to
// someone else. The key must exist (ErrNotFound otherwise); WithLease is
// ignored. Unlike WithLease of the same lease, it asks nothing about the
// lease's other keys: etcd checks a writer's permission on every key bound
// to a lease it attaches, and none for a key that keeps its lease.
func KeepLease() WriteOption {
	return func(o *WriteOptions) { o.KeepLease = true }
}

// ApplyWriteOptions folds opts into WriteOptions.
func ApplyWriteOptions(opts []WriteOption) WriteOptions {
	var o WriteOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// DeleteOption modifies one Delete.
type DeleteOption func(*DeleteOptions)

// DeleteOptions is the result of applying DeleteOptions.
type DeleteOptions struct {
	// IfModRevision, when non-zero, deletes only if the key's ModRevision
	// equals it.
	IfModRevision int64
}

// IfModRevision deletes only if the key was not written since revision rev.
func IfModRevision(rev int64) DeleteOption {
	return func(o *DeleteOptions) { o.IfModRevision = rev }
}

// ApplyDeleteOptions folds opts into DeleteOptions.
func ApplyDeleteOptions(opts []DeleteOption) DeleteOptions {
	var o DeleteOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o
}

// ValidateKey checks a key: 1 to MaxKeySize bytes of valid UTF-8.
func ValidateKey(key string) error {
	switch {
	case key == "":
		return fmt.Errorf("%w: empty key", ErrInvalidKey)
	case len(key) > MaxKeySize:
		return fmt.Errorf("%w: key of %d bytes is longer than the %d-byte limit", ErrInvalidKey, len(key), MaxKeySize)
	case !utf8.ValidString(key):
		return fmt.Errorf("%w: key %q is not valid UTF-8", ErrInvalidKey, key)
	}
	return nil
}

// ValidatePrefix checks a List or Watch prefix: empty (everything) or a
// valid key.
func ValidatePrefix(prefix string) error {
	if prefix == "" {
		return nil
	}
	return ValidateKey(prefix)
}

// ValidateValue checks a value's size.
func ValidateValue(value []byte) error {
	if len(value) > MaxValueSize {
		return fmt.Errorf("%w: %d bytes is more than the %d-byte limit", ErrValueTooLarge, len(value), MaxValueSize)
	}
	return nil
}

// ValidateTTL checks a lease TTL.
func ValidateTTL(ttl time.Duration) error {
	if ttl < MinLeaseTTL || ttl > MaxLeaseTTL {
		return fmt.Errorf("%w: %v is outside [%v, %v]", ErrInvalidTTL, ttl, MinLeaseTTL, MaxLeaseTTL)
	}
	return nil
}

// ValidateWrite checks the key and value of a write.
func ValidateWrite(key string, value []byte) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	return ValidateValue(value)
}

// ValidateOps checks every op of a transaction.
func ValidateOps(ops []Op) error {
	if len(ops) == 0 {
		return fmt.Errorf("store: empty transaction")
	}
	seen := seenKeys.Get().(map[string]struct{})
	defer func() {
		if len(seen) <= maxPooledSeen {
			clear(seen)
			seenKeys.Put(seen)
		}
	}()
	for _, op := range ops {
		if err := ValidateWrite(op.Key, op.Value); err != nil {
			return err
		}
		if op.Kind != OpPut && op.Kind != OpDelete {
			return fmt.Errorf("store: op on %q has unknown kind %d", op.Key, op.Kind)
		}
		if _, dup := seen[op.Key]; dup {
			return fmt.Errorf("%w: key %q appears twice in one transaction", ErrInvalidKey, op.Key)
		}
		seen[op.Key] = struct{}{}
	}
	return nil
}

// seenKeys recycles ValidateOps's sets of keys: one made for every
// transaction was a twentieth of what a batched registration allocated.
// A set grown past maxPooledSeen keys is left to the collector.
var seenKeys = sync.Pool{New: func() any { return make(map[string]struct{}) }}

const maxPooledSeen = 1024
