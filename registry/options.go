package registry

import "time"

// Option accessors for registry implementations outside this package (the
// option types' fields are unexported so that only this package's
// constructors make options).

// DrainGraceOf returns the grace period opts set, and whether one was set.
func DrainGraceOf(opts ...DrainOption) (time.Duration, bool) {
	var o drainOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o.grace, o.hasGrace
}

// FromRevisionOf returns the revision opts resume from (0: a fresh watch).
func FromRevisionOf(opts ...WatchOption) int64 {
	var o watchOptions
	for _, opt := range opts {
		opt(&o)
	}
	return o.fromRevision
}
