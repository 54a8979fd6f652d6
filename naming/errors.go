package naming

import "errors"

// Sentinel errors; match them with errors.Is.
var (
	// ErrInvalidTarget reports a target that is not
	// beacon:///namespace/component/endpoint. Build returns it wrapped in
	// an error that says what was wrong.
	ErrInvalidTarget = errors.New("naming: invalid target")
	// ErrNoInstances is reported to gRPC while the target has no serving
	// instance that gRPC can dial (none registered, or all draining or
	// failing their health check), so that RPCs fail fast (unless they
	// wait for ready) instead of hanging.
	ErrNoInstances = errors.New("naming: no serving instances")
	// ErrStale is reported to gRPC while the registry watch has lost its
	// backend: the channel keeps using the last known instances, and the
	// resolver pushes the full state again once the watch is back.
	ErrStale = errors.New("naming: instance list may be stale")
	// ErrWatchEnded is reported to gRPC when the registry watch ended
	// unexpectedly; the resolver watches again with backoff.
	ErrWatchEnded = errors.New("naming: registry watch ended")
	// ErrInvalidConfig reports a bad argument to NewBuilder.
	ErrInvalidConfig = errors.New("naming: invalid builder configuration")
)
