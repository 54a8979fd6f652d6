package registry

import (
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// State is the state of a registry's session: the one lease a process holds
// for all its registrations.
type State uint8

const (
	// StateIdle: no lease yet (nothing registered so far).
	StateIdle State = iota
	// StateActive: the lease is held and every registration is written.
	StateActive
	// StateLost: the store said the lease ended (it expired, or someone
	// else revoked it). The instances are not advertised; the session
	// retries with capped backoff, forever, to get a new lease and
	// re-register them with the same IDs. A lease whose renewals went
	// unanswered for a whole TTL is not lost but unconfirmed: see
	// ErrLeaseUnconfirmed.
	StateLost
	// StateRecovered: after a loss, a lease is held again and the
	// registrations are written again (except those whose IDs another live
	// process took meanwhile: see StateChange.Conflicts). The session works
	// as in StateActive.
	StateRecovered
	// StateClosed: the registry was closed and its lease revoked.
	StateClosed
)

func (s State) String() string {
	switch s {
	case StateIdle:
		return "idle"
	case StateActive:
		return "active"
	case StateLost:
		return "lost"
	case StateRecovered:
		return "recovered"
	case StateClosed:
		return "closed"
	}
	return "unknown"
}

// MarshalText renders the state as idle, active, lost, recovered or closed.
func (s State) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// StateChange is one transition of the session, delivered on
// StoreRegistry.States.
type StateChange struct {
	State State
	// Lease is the lease held in the new state (store.NoLease when none).
	Lease store.LeaseID
	// At is when the transition happened.
	At time.Time
	// Err says why the lease was lost (StateLost), or, with Conflicts, why
	// some instances are not advertised, or (matching ErrLeaseUnconfirmed,
	// with the State unchanged) that no renewal was answered for a whole
	// TTL; a later StateChange with the same State and no error says a
	// renewal succeeded again.
	Err error
	// Registered is the number of instances advertised in this state.
	Registered int
	// Drained lists instances the session found marked draining in the
	// store by someone else (an operator; see Operator) while it
	// advertised them serving. It adopted the drain: their Registration's
	// Instance shows draining, and nothing the session writes undoes it
	// until the owner's Update sets Status. Err (matching
	// ErrDrainedElsewhere) says so; the State is unchanged.
	Drained []beacon.Ref
	// Conflicts lists the instances whose IDs another live process holds:
	// they are not advertised, and the session keeps trying to reclaim
	// them (each attempt is a create-if-absent, never an overwrite). A
	// StateChange with the same State and fewer Conflicts reports progress.
	Conflicts []beacon.Ref
}
