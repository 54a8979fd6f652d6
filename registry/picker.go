package registry

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync/atomic"

	"github.com/beaconplane/beacon"
)

// ErrNoInstances is returned by a Picker that has no serving instance.
var ErrNoInstances = errors.New("registry: no serving instance to pick")

// Picker chooses an instance for each call. Update replaces the candidates
// (draining instances are left out); Pick is safe for concurrent use and
// does not allocate. Instances returned share their Metadata map with the
// picker: do not modify it.
type Picker interface {
	Pick() (beacon.Instance, error)
	Update(instances []beacon.Instance)
}

// serving keeps the instances that take new work.
func serving(in []beacon.Instance) []beacon.Instance {
	out := make([]beacon.Instance, 0, len(in))
	for _, i := range in {
		if i.Serving() {
			out = append(out, i)
		}
	}
	return out
}

type candidates struct {
	list atomic.Pointer[[]beacon.Instance]
}

func (c *candidates) Update(in []beacon.Instance) {
	s := serving(in)
	c.list.Store(&s)
}

func (c *candidates) load() []beacon.Instance {
	if p := c.list.Load(); p != nil {
		return *p
	}
	return nil
}

// RoundRobin picks the serving instances in turn.
type RoundRobin struct {
	candidates
	next atomic.Uint64
}

// NewRoundRobin returns a round-robin picker over instances.
func NewRoundRobin(instances []beacon.Instance) *RoundRobin {
	p := &RoundRobin{}
	p.Update(instances)
	return p
}

// Pick implements Picker.
func (p *RoundRobin) Pick() (beacon.Instance, error) {
	l := p.load()
	if len(l) == 0 {
		return beacon.Instance{}, ErrNoInstances
	}
	return l[(p.next.Add(1)-1)%uint64(len(l))], nil
}

// Random picks a serving instance uniformly at random.
type Random struct{ candidates }

// NewRandom returns a random picker over instances.
func NewRandom(instances []beacon.Instance) *Random {
	p := &Random{}
	p.Update(instances)
	return p
}

// Pick implements Picker.
func (p *Random) Pick() (beacon.Instance, error) {
	l := p.load()
	if len(l) == 0 {
		return beacon.Instance{}, ErrNoInstances
	}
	return l[rand.IntN(len(l))], nil
}

// P2C is power-of-two-choices: it draws two distinct serving instances at
// random and picks the one with the lower load, as reported by the caller's
// load function (in-flight requests, queue depth...). It spreads load almost
// as well as least-loaded without scanning every instance.
type P2C struct {
	candidates
	load func(beacon.Instance) float64
}

// NewP2C returns a power-of-two-choices picker. load must be safe for
// concurrent use; ties go to the first draw.
func NewP2C(instances []beacon.Instance, load func(beacon.Instance) float64) *P2C {
	p := &P2C{load: load}
	p.Update(instances)
	return p
}

// Pick implements Picker.
func (p *P2C) Pick() (beacon.Instance, error) {
	l := p.candidates.load()
	switch len(l) {
	case 0:
		return beacon.Instance{}, ErrNoInstances
	case 1:
		return l[0], nil
	}
	i := rand.IntN(len(l))
	j := rand.IntN(len(l) - 1)
	if j >= i {
		j++
	}
	if p.load(l[j]) < p.load(l[i]) {
		return l[j], nil
	}
	return l[i], nil
}

// Follow feeds the watcher's view to the pickers after every batch, until
// the watch ends; it returns the error that ended it (ctx.Err(),
// ErrWatchClosed or ErrClosed). Stale batches leave the pickers as they are:
// the last known instances stay usable while the watch recovers.
func Follow(ctx context.Context, w Watcher, pickers ...Picker) error {
	for {
		b, err := w.Next(ctx)
		if err != nil {
			return err
		}
		if b.Kind == Stale {
			continue
		}
		view := w.Instances()
		for _, p := range pickers {
			p.Update(view)
		}
	}
}
