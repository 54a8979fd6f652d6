package store

import (
	"errors"
	"fmt"
)

// Sentinel errors. Backends wrap them with context; match with errors.Is.
var (
	ErrNotFound      = errors.New("store: key not found")
	ErrKeyExists     = errors.New("store: key exists")
	ErrConflict      = errors.New("store: revision mismatch")
	ErrLeaseNotFound = errors.New("store: lease not found (expired or revoked)")
	ErrCompacted     = errors.New("store: revision compacted")
	ErrClosed        = errors.New("store: closed")
	ErrInvalidKey    = errors.New("store: invalid key")
	ErrValueTooLarge = errors.New("store: value too large")
	ErrInvalidTTL    = errors.New("store: invalid lease TTL")
	// ErrUnavailable wraps failures to reach the backend (dial timeouts,
	// lost connections). The operation may or may not have been applied
	// if the failure happened after the request was sent.
	ErrUnavailable = errors.New("store: backend unavailable")
	// ErrWatchSilent ends a watch that heard nothing from the backend (no
	// event, no sign of life) for longer than the bound its backend states:
	// a stream stuck on a hung or partitioned server. It comes with
	// ErrUnavailable. Re-list, then watch again (a backend with several
	// servers then uses another one).
	ErrWatchSilent = errors.New("store: watch stream silent")
	// ErrPermissionDenied wraps a refusal by the backend's access control:
	// the identity the store acts as may not read or write the key (etcd
	// users and roles). Retrying does not help; granting does.
	ErrPermissionDenied = errors.New("store: permission denied")
	// ErrUnauthenticated wraps a refusal of the store's credentials: no
	// user, a wrong password, or a token that expired or belongs to
	// another cluster.
	ErrUnauthenticated = errors.New("store: not authenticated")
)

// CompactedError reports a watch that asked for history the store no longer
// has. Re-list, then watch from the listing's revision + 1.
type CompactedError struct {
	// Requested is the revision the watch needed.
	Requested int64
	// CompactRevision is the oldest revision the store still has.
	CompactRevision int64
}

func (e *CompactedError) Error() string {
	return fmt.Sprintf("store: revision %d compacted (oldest available %d): re-list and watch from the new revision",
		e.Requested, e.CompactRevision)
}

// Unwrap returns ErrCompacted.
func (e *CompactedError) Unwrap() error { return ErrCompacted }

// ConflictError names the key whose precondition failed.
type ConflictError struct {
	Key string
	// Err is ErrConflict, ErrKeyExists or ErrNotFound.
	Err error
}

func (e *ConflictError) Error() string { return fmt.Sprintf("%v: %q", e.Err, e.Key) }

// Unwrap returns the underlying sentinel.
func (e *ConflictError) Unwrap() error { return e.Err }

// Is lets every precondition failure match ErrConflict too.
func (e *ConflictError) Is(target error) bool { return target == ErrConflict }
