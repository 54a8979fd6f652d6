package proxy

import "errors"

// Sentinel errors; match them with errors.Is.
var (
	// ErrBadMode: the mode is neither readwrite nor readonly.
	ErrBadMode = errors.New("proxy: unknown mode")
	// ErrConflictingDiscovery: more than one way to find the cluster is set.
	ErrConflictingDiscovery = errors.New("proxy: conflicting discovery settings")
	// ErrInvalidConfig: a setting is invalid.
	ErrInvalidConfig = errors.New("proxy: invalid config")
	// ErrBadURL: a member, discovery or endpoint URL is malformed.
	ErrBadURL = errors.New("proxy: malformed URL")
	// ErrDiscovery: the discovery service answered, but not with a usable
	// cluster (for example the token's size key is missing).
	ErrDiscovery = errors.New("proxy: discovery failed")
	// ErrSizeNotFound: the discovery token has no size key
	// (_config/size): the token was never created or has expired.
	ErrSizeNotFound = errors.New("proxy: discovery: size key not found")
	// ErrNoMembers: no member could be reached to read the member list.
	ErrNoMembers = errors.New("proxy: no cluster member reachable")
	// ErrNoEndpoints: no endpoint is currently usable (returned to clients
	// as gRPC Unavailable / HTTP 503).
	ErrNoEndpoints = errors.New("proxy: zero endpoints currently available")
	// ErrNotReady: the proxy has not found a reachable member of its
	// cluster yet (returned to clients as gRPC Unavailable / HTTP 503
	// while it looks, after Serve was called).
	ErrNotReady = errors.New("proxy: not ready")
	// ErrClosed: the proxy was closed.
	ErrClosed = errors.New("proxy: closed")
	// ErrServing: Serve or Run was called twice.
	ErrServing = errors.New("proxy: already serving")
)
