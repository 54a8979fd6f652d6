package kube

import (
	"time"

	"github.com/beaconplane/beacon/registry"
)

// The registry's state, as registry.SessionReporter reports it. There is
// no lease: the state says whether this process's InstanceSet is in place.
//
//	idle       nothing written yet
//	active     the InstanceSet is written
//	lost       it is gone: deleted by someone else (it is written again:
//	           recovered follows), or, for good, its pod is gone or another
//	           process took it over (Err says which)
//	recovered  written again after a loss
//	closed     the registry closed (and deleted its InstanceSet)
//
// A write that fails does not change the state (what was written before
// stays advertised); Registration.Err reports it until a write succeeds.

var _ registry.SessionReporter = (*Registry)(nil)

const statesBuffer = 16

// State implements registry.SessionReporter.
func (r *Registry) State() registry.State {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	return r.state
}

// States implements registry.SessionReporter: the state changes, buffered;
// if the reader falls behind, the oldest are dropped so that the latest is
// always delivered. It is closed by Close, after StateClosed.
func (r *Registry) States() <-chan registry.StateChange { return r.states }

// transition moves to state s (no-op if already there, unless err is set).
func (r *Registry) transition(s registry.State, err error, registered int) {
	r.stateMu.Lock()
	defer r.stateMu.Unlock()
	if r.state == registry.StateClosed || (r.state == s && err == nil) {
		return
	}
	r.state = s
	c := registry.StateChange{State: s, At: time.Now(), Err: err, Registered: registered}
	for {
		select {
		case r.states <- c:
			if s == registry.StateClosed {
				close(r.states)
			}
			return
		default:
		}
		select {
		case <-r.states:
		default:
		}
	}
}
