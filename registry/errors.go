package registry

import "errors"

// Sentinel errors. Validation failures are *beacon.FieldError values
// (matching beacon.ErrInvalid); an ID held by another registration matches
// beacon.ErrAlreadyRegistered; an unknown instance beacon.ErrNotFound.
var (
	// ErrClosed is returned by every call after the registry was closed.
	ErrClosed = errors.New("registry: closed")
	// ErrWatchClosed is returned by Watcher.Next after the watch ended
	// (Close, or its context done).
	ErrWatchClosed = errors.New("registry: watch closed")
	// ErrLeaseLost reports that the session's lease ended: the store said
	// so (it expired, or someone revoked it). The session is granting a
	// new lease and re-registering every instance.
	ErrLeaseLost = errors.New("registry: lease lost; re-registering")
	// ErrLeaseUnconfirmed reports that no keep-alive of the session's
	// lease was answered for a whole TTL: the store could not be reached,
	// so whether it still holds the lease is unknown (etcd extends every
	// lease when a new leader takes over, so after an election it usually
	// does). The session keeps renewing the same lease and reports it lost
	// only once the store says it ended (StateChange with this error and
	// an unchanged State; a later StateChange with no error says a renewal
	// succeeded).
	ErrLeaseUnconfirmed = errors.New("registry: no keep-alive answered for a whole TTL; the lease is kept alive until the store says whether it still holds it")
	// ErrLeaseMismatch reports an instance bound to another lease than the
	// one the caller presented.
	ErrLeaseMismatch = errors.New("registry: instance is bound to another lease")
	// ErrIdentityChanged reports an Update that changed the instance's
	// namespace, component, endpoint, ID or registration time.
	ErrIdentityChanged = errors.New("registry: update may not change the instance's identity")
	// ErrInvalidTTL reports a lease TTL outside [MinLeaseTTL, MaxLeaseTTL].
	ErrInvalidTTL = errors.New("registry: invalid lease TTL")
	// ErrDrainedElsewhere reports instances of a session that someone
	// else (an operator) marked draining in the store; the session
	// advertises them draining from then on (StateChange.Drained).
	ErrDrainedElsewhere = errors.New("registry: instance drained in the store by someone else (an operator?); advertising it as draining")
	// ErrNoTTLCheck reports a TTL report (Report, ReportLeased) for an
	// instance that declares no TTL check. It comes with beacon.ErrInvalid.
	ErrNoTTLCheck = errors.New("registry: the instance declares no TTL check")
	// ErrInvalidConfig reports a Config that does not validate.
	ErrInvalidConfig = errors.New("registry: invalid config")
)
