package health

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/prometheus/client_golang/prometheus"
)

// minCutOffInstances is how many instances a checker must own before a
// high failing share can say that it, not they, is cut off.
const minCutOffInstances = 3

// linkState is whether a checker trusts its own failures: a checker that
// is itself cut off (from the network, from the instances) marks nothing.
type linkState uint8

const (
	// connected: the checker writes its verdicts as they come.
	connected linkState = iota
	// cutOff: the checker has withdrawn its failing verdicts and writes
	// none until it recovers; its passing verdicts are still written.
	cutOff
)

func (s linkState) String() string {
	if s == cutOff {
		return "cut off"
	}
	return "connected"
}

// assessment is what one look at the checker's standing found.
type assessment struct {
	owned, failing int  // this checker's instances, and how many fail
	peers          int  // the other live checkers
	reached        bool // one of them answered a TCP connect
	// shares is each peer's failing share (failing verdicts it wrote over
	// the instances it owns), known only when the checker's own share is
	// high and the verdicts could be read.
	shares      map[string]float64
	sharesKnown bool
}

// highShare reports more than half of at least minCutOffInstances
// failing.
func highShare(failing, owned int) bool { return owned >= minCutOffInstances && 2*failing > owned }

// cutOffReason says why a shows the checker cut off, or "" when it does
// not. A checker without peers cannot tell its outage from the
// instances': it is never cut off.
func (a assessment) cutOffReason() string {
	switch {
	case a.peers == 0:
		return ""
	case !a.reached:
		return fmt.Sprintf("none of its %d peer checkers answers a TCP connect", a.peers)
	case !highShare(a.failing, a.owned) || !a.sharesKnown:
		return ""
	}
	for _, s := range a.shares {
		if s >= 0.5 {
			return "" // a peer sees as many failures: they are the instances'
		}
	}
	return fmt.Sprintf("%d of its %d instances fail while every peer's failing share is below half", a.failing, a.owned)
}

// cutoffDetector moves a checker between connected and cutOff, one
// assessment at a time:
//
//	connected --cut off (no peer answers, or failing far more than every peer)--> cutOff   (enter)
//	cutOff    --neither any more------------------------------------------------> connected (recover)
type cutoffDetector struct {
	state linkState
	w     *verdictWriter
	gauge prometheus.Gauge
	log   *slog.Logger
}

// observe applies one assessment and returns the state after it.
func (d *cutoffDetector) observe(a assessment) linkState {
	reason := a.cutOffReason()
	switch {
	case d.state == connected && reason != "":
		d.enter(reason)
	case d.state == cutOff && reason == "":
		d.recover()
	}
	return d.state
}

// enter: the checker is cut off. It warns once, withdraws its failing
// verdicts, and writes none until it recovers.
func (d *cutoffDetector) enter(reason string) {
	d.state = cutOff
	d.gauge.Set(1)
	d.w.setCutOff(true)
	d.log.Warn("this health checker is cut off: it withdraws its failing verdicts and writes none until it recovers "+
		"(the instances it checks are served meanwhile)", "reason", reason)
}

// recover: the checker is connected again; its current failing verdicts
// are written.
func (d *cutoffDetector) recover() {
	d.state = connected
	d.gauge.Set(0)
	d.w.setCutOff(false)
	d.log.Info("this health checker is connected again: it writes its failing verdicts again")
}

// assess looks at the checker's standing: its own failing share, whether
// a peer answers, and (when its own share is high) its peers' shares.
func (c *Checker) assess(ctx context.Context) assessment {
	var a assessment
	c.mu.Lock()
	for _, rn := range c.runners {
		a.owned++
		if rn.failing.Load() {
			a.failing++
		}
	}
	peers := c.fleet.peers()
	c.mu.Unlock()
	a.peers = len(peers)
	a.reached = c.reachAny(ctx, peers)
	if a.peers > 0 && a.reached && highShare(a.failing, a.owned) {
		c.mu.Lock()
		a.shares, a.sharesKnown = peerShares(c.fleet), true
		c.mu.Unlock()
	}
	return a
}

// reachAny reports whether one of peers answers a TCP connect at its
// address.
func (c *Checker) reachAny(ctx context.Context, peers []peer) bool {
	d := net.Dialer{Timeout: min(c.cfg.PeerInterval/2, 2*time.Second)}
	for _, p := range peers {
		conn, err := d.DialContext(ctx, "tcp", p.addr)
		if err == nil {
			_ = conn.Close()
			return true
		}
	}
	return false
}

// peerShares returns the failing share of every peer in f: of the
// instances it owns, those whose verdict it wrote says failing (0 for a
// peer that owns none), as the registry's view joins the verdicts.
func peerShares(f *fleet) map[string]float64 {
	owned, failing := map[string]int{}, map[string]int{}
	for ref := range f.checked {
		o := f.owner(ref)
		owned[o]++
		if h, ok := f.verdicts[ref]; ok && h.Checker == o && h.Status == beacon.HealthFailing {
			failing[o]++
		}
	}
	out := map[string]float64{}
	for _, id := range f.ids {
		if id == f.self {
			continue
		}
		out[id] = 0
		if owned[id] > 0 {
			out[id] = float64(failing[id]) / float64(owned[id])
		}
	}
	return out
}
