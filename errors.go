package beacon

import (
	"errors"
	"fmt"

	"github.com/beaconplane/beacon/internal/clip"
)

// Sentinel errors. Every validation failure is a *FieldError that matches
// ErrInvalid and one of the more specific sentinels below with errors.Is.
var (
	// ErrInvalid matches every validation failure.
	ErrInvalid = errors.New("beacon: invalid argument")

	ErrInvalidName      = errors.New("beacon: invalid name")
	ErrInvalidID        = errors.New("beacon: invalid instance id")
	ErrInvalidKey       = errors.New("beacon: key outside the layout")
	ErrInvalidAddress   = errors.New("beacon: invalid address")
	ErrInvalidMetadata  = errors.New("beacon: invalid metadata")
	ErrMetadataTooLarge = errors.New("beacon: metadata too large")

	// ErrNotFound reports an instance that is not registered.
	ErrNotFound = errors.New("beacon: instance not found")
	// ErrAlreadyRegistered reports an instance ID held by another live
	// registration. Beacon never overwrites it.
	ErrAlreadyRegistered = errors.New("beacon: instance already registered")
)

// FieldError describes one rejected input: which field, the offending value,
// and the rule it broke, phrased so that the reader knows what to do.
type FieldError struct {
	Field string // "namespace", "metadata", "key", ...
	Value string // the rejected value, shortened if long
	Rule  string // the rule that was broken
	Err   error  // the specific sentinel, e.g. ErrInvalidName
}

func (e *FieldError) Error() string {
	return fmt.Sprintf("beacon: invalid %s %q: %s", e.Field, e.Value, e.Rule)
}

// Unwrap returns the specific sentinel.
func (e *FieldError) Unwrap() error { return e.Err }

// Is reports whether target is ErrInvalid, so that every validation failure
// can be recognised with one check.
func (e *FieldError) Is(target error) bool { return target == ErrInvalid }

func fieldError(sentinel error, field, value, rule string) error {
	return &FieldError{Field: field, Value: shorten(value), Rule: rule, Err: sentinel}
}

// shorten keeps error messages readable when the input is huge.
func shorten(s string) string { return clip.String(s, 80) }
