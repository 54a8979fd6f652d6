package health

import (
	"context"
	"fmt"
	"log/slog"
	"maps"
	"net"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/prometheus/client_golang/prometheus"
)

// minCutOffInstances is how many instances a checker must own before a
// high failing share can say that it, not they, is cut off.
const minCutOffInstances = 3

// maxSettle caps how long a doubtful checker holds its failing verdicts
// before it may conclude. Its peers show the same failures once their
// own instances have been probed, which the intervals of the instances
// failing for it estimate; but one slow check among those (an instance
// checked every 10 minutes, failing for hours) must not hold every other
// failure that long. 30 s is three default intervals (and three default
// peer looks): a peer whose instances fail too has probed them by then
// unless all of them are checked less often. Concluding too early costs
// little: a checker that finds itself cut off wrongly recovers at the
// first look where a peer fails as much, and checks its failing
// instances afresh; holding too long costs every failing instance its
// detection.
const maxSettle = 30 * time.Second

// linkState is whether a checker trusts its own failures: a checker that
// is itself cut off (from the network, from the instances) marks nothing.
type linkState uint8

const (
	// connected: the checker writes its verdicts as they come.
	connected linkState = iota
	// doubtful: more than half of its instances fail for it, and it has
	// not yet found whether its peers see as many failures: it holds its
	// failing verdicts (those already written stay) until it can tell.
	doubtful
	// confirmed: more than half fail, and a peer sees as many: the
	// instances' outage; the checker writes its verdicts.
	confirmed
	// cutOff: the checker has withdrawn its failing verdicts and writes
	// none until it recovers; its passing verdicts are still written.
	cutOff
)

func (s linkState) String() string {
	return [...]string{"connected", "doubtful", "confirmed", "cut off"}[s]
}

// assessment is what one look at the checker's standing found.
type assessment struct {
	// owned are this checker's instances; failing, those whose latest
	// result or verdict is a failure (their Runners see failures before
	// their verdicts turn: a checker cut off sees them at once on all).
	owned, failing int
	// decisive: the look may conclude that the checker is cut off or not
	// — a Runner turned Failing since the last look, or it is the
	// regular one. A look for another reason (a change in the share of
	// failures, or in a peer's) only holds or releases.
	decisive bool
	peers    int  // the other live checkers
	reached  bool // one of them answered a TCP connect
	// shares is each peer's failing share (failing verdicts it wrote over
	// the instances it owns; 1 for a peer that publishes that more than
	// half of its own fail: CheckerSuspectMetadata), known only when the
	// checker's own share is high and the verdicts could be read.
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

// cutoffDetector moves a checker between its link states, one assessment
// at a time (high: more than half of its instances fail for it):
//
//	connected --high, with peers--> doubtful  (hold its failing verdicts, for at least settle)
//	connected, doubtful --high, no peers--> confirmed  (alone it cannot tell: it writes them)
//	doubtful  --decisive, a peer fails as much--> confirmed  (release them)
//	doubtful, confirmed --not high--> connected  (release)
//	any --cut off (no peer answers; or decisive, doubtful or confirmed, and failing far more than every peer)--> cutOff  (enter)
//	cutOff    --neither any more--> connected  (recover)
//
// So a checker cut off from its instances alone, which sees most of them
// fail before their verdicts turn Failing, writes none of those verdicts:
// it holds them from the first failures until its first Failing verdict
// makes it compare with its peers. Back to connected, it does not trust
// the failures seen meanwhile: it checks the instances failing for it
// afresh (recheck), and writes what their new Runners find.
type cutoffDetector struct {
	state linkState
	w     *verdictWriter
	gauge prometheus.Gauge
	log   *slog.Logger
	// since it is doubtful, and for how long it stays so before it may
	// conclude (settleTime): the longest check interval of the instances
	// failing for it then, at most maxSettle, within which its peers,
	// whose Runners probe at other moments, see the same failures and
	// publish that they do.
	since     time.Time
	settleFor time.Duration
}

// doubt holds the failing verdicts of a connected checker whose share of
// failures is high and which has peers, before they are asked; settle
// returns how long it stays doubtful before it may conclude. A checker
// without peers holds nothing: it has no one to compare with and is
// never cut off, so holding would only delay the verdicts it writes in
// the end.
func (d *cutoffDetector) doubt(a assessment, settle func() time.Duration) {
	if d.state == connected && a.peers > 0 && highShare(a.failing, a.owned) {
		d.state, d.since, d.settleFor = doubtful, time.Now(), settle()
		d.w.hold(false)
		d.log.Info("most of the instances this health checker checks fail for it: it holds their failing verdicts "+
			"until it can tell its own outage from theirs", "failing", a.failing, "instances", a.owned)
	}
}

// unsettled returns how long a doubtful checker has yet to wait before it
// may conclude (0: it may).
func (d *cutoffDetector) unsettled() time.Duration {
	if d.state != doubtful {
		return 0
	}
	return max(d.settleFor-time.Since(d.since), 0)
}

// observe applies one assessment and returns the state after it; recheck
// restarts the Runners whose verdict is Failing (called when the checker
// is connected again after holding).
func (d *cutoffDetector) observe(a assessment, recheck func()) linkState {
	reason := a.cutOffReason()
	switch {
	case d.state == cutOff:
		if reason == "" {
			d.recover(recheck)
		}
	case reason != "" && !a.reached:
		d.enter(reason)
	case !highShare(a.failing, a.owned):
		d.settle(connected, recheck)
	case a.peers == 0:
		d.settle(confirmed, recheck) // alone: its failures are taken as the instances' (see doubt)
	default:
		d.doubt(a, func() time.Duration { return 0 }) // if the caller did not
		switch {
		case !a.decisive:
		case reason != "":
			d.enter(reason)
		case d.state == doubtful:
			d.settle(confirmed, recheck)
		}
	}
	return d.state
}

// settle leaves connected, doubtful or confirmed for to. Leaving doubtful,
// it writes what it held — as found (confirmed: a peer sees as many
// failures), or checked afresh (connected: few fail now).
func (d *cutoffDetector) settle(to linkState, recheck func()) {
	if d.state == to {
		return
	}
	if d.state == doubtful {
		if to == connected {
			recheck()
		}
		d.w.release()
		d.log.Info("this health checker writes its failing verdicts again", "as", to.String())
	}
	d.state = to
}

// enter: the checker is cut off. It warns once, withdraws its failing
// verdicts, and writes none until it recovers.
func (d *cutoffDetector) enter(reason string) {
	d.state = cutOff
	d.gauge.Set(1)
	d.w.hold(true)
	d.log.Warn("this health checker is cut off: it withdraws its failing verdicts and writes none until it recovers "+
		"(the instances it checks are served meanwhile)", "reason", reason)
}

// recover: the checker is connected again; the instances failing for it
// are checked afresh, and failing verdicts written again.
func (d *cutoffDetector) recover(recheck func()) {
	d.state = connected
	d.gauge.Set(0)
	recheck()
	d.w.release()
	d.log.Info("this health checker is connected again: it writes its failing verdicts again")
}

// stand assesses the checker's standing every Config.PeerInterval and
// whenever woken (wake), until the checker closes. The regular look, and
// one after a Runner turned Failing, are decisive — but for a checker
// doubtful for less than its settle time, which looks again then.
func (c *Checker) stand() {
	t := time.NewTicker(c.cfg.PeerInterval)
	defer t.Stop()
	var settled *time.Timer // wakes a doubtful checker when it may conclude ...
	deferred := false       // ... a decisive look it put off
	defer func() {
		if settled != nil {
			settled.Stop()
		}
	}()
	for {
		tick := false
		select {
		case <-c.ctx.Done():
			return
		case <-t.C:
			tick = true
		case <-c.kick:
		}
		if c.ctx.Err() != nil {
			return
		}
		a := assessment{owned: int(c.owned.Load()), failing: int(c.doubtful.Load()), peers: c.peerCount()}
		c.cut.doubt(a, c.settleTime) // before the peers are asked: that may take a while
		if tick || deferred || c.turnedFailing.Load() {
			switch wait := c.cut.unsettled(); {
			case wait > 0 && settled == nil:
				settled, deferred = time.AfterFunc(wait, c.wake), true
			case wait > 0:
				settled.Reset(wait)
				deferred = true
			default:
				a.decisive, deferred = true, false
				c.turnedFailing.Store(false)
			}
		}
		c.askPeers(c.ctx, &a)
		state := c.cut.observe(a, c.recheck)
		c.publishSuspect(highShare(a.failing, a.owned))
		if c.assessed != nil {
			c.assessed(a, state)
		}
	}
}

// wake makes the assessment goroutine look again soon.
func (c *Checker) wake() {
	select {
	case c.kick <- struct{}{}:
	default:
	}
}

// count records the latest result of rn's Runner (after its verdict),
// and wakes the assessment when the checker's share of failures crosses
// half.
func (c *Checker) count(rn *running, failed bool) {
	rn.mu.Lock()
	doubt := failed || rn.failing.Load()
	if rn.stopped || doubt == rn.doubt {
		rn.mu.Unlock()
		return
	}
	rn.doubt = doubt
	delta := int64(1)
	if !doubt {
		delta = -1
	}
	n, owned := c.doubtful.Add(delta), int(c.owned.Load())
	rn.mu.Unlock()
	if highShare(int(n), owned) != highShare(int(n-delta), owned) {
		c.wake()
	}
}

// uncount stops counting rn, whose Runner is stopped.
func (c *Checker) uncount(rn *running) {
	rn.mu.Lock()
	defer rn.mu.Unlock()
	if rn.doubt {
		c.doubtful.Add(-1)
	}
	rn.stopped, rn.doubt = true, false
}

// recheck restarts the Runners whose latest result or verdict is a
// failure: a verdict formed, or a run of failures begun, while the checker
// could not tell its outage from theirs is not trusted (a probe sent
// before the partition healed may still fail after). The new Runner
// starts from Unknown; the verdict in the store stays until it writes its
// own.
func (c *Checker) recheck() {
	c.mu.Lock()
	defer c.mu.Unlock()
	for ref, rn := range c.runners {
		rn.mu.Lock()
		doubt := rn.doubt
		rn.mu.Unlock()
		if doubt {
			rn.cancel()
			c.uncount(rn)
			delete(c.runners, ref)
			c.startLocked(ref, rn.target)
		}
	}
}

// settleTime returns how long a doubtful checker holds before it may
// conclude: the longest check interval of the instances failing for it
// (latest result or verdict), at most maxSettle. Only those: an
// instance that passes says nothing of the outage, and its interval (one
// team's 10-minute check) must not delay every other instance's verdict.
func (c *Checker) settleTime() time.Duration {
	c.mu.Lock()
	defer c.mu.Unlock()
	var longest time.Duration
	for _, rn := range c.runners {
		rn.mu.Lock()
		if rn.doubt {
			longest = max(longest, rn.target.check.WithDefaults().Interval)
		}
		rn.mu.Unlock()
	}
	return min(longest, maxSettle)
}

// peerCount returns how many other checkers are registered.
func (c *Checker) peerCount() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return len(c.fleet.peers())
}

// askPeers completes a: whether a peer answers, and (when its own share
// is high) its peers' shares.
func (c *Checker) askPeers(ctx context.Context, a *assessment) {
	c.mu.Lock()
	peers := c.fleet.peers()
	c.mu.Unlock()
	a.peers = len(peers)
	a.reached = c.reachAny(ctx, peers)
	if a.peers > 0 && a.reached && highShare(a.failing, a.owned) {
		c.mu.Lock()
		a.shares, a.sharesKnown = peerShares(c.fleet), true
		c.mu.Unlock()
	}
}

// publishSuspect says in the checker's registration whether more than
// half of its instances fail for it (CheckerSuspectMetadata), so that a
// peer in doubt can tell that it sees as many failures before it has
// written them.
func (c *Checker) publishSuspect(on bool) {
	c.mu.Lock()
	reg := c.reg
	c.mu.Unlock()
	if on == c.suspect || reg == nil {
		return
	}
	ctx, cancel := context.WithTimeout(c.ctx, c.writer.callTimeout())
	defer cancel()
	err := reg.Update(ctx, func(in *beacon.Instance) {
		md := maps.Clone(in.Metadata)
		delete(md, CheckerSuspectMetadata)
		if on {
			md[CheckerSuspectMetadata] = "true"
		}
		in.Metadata = md
	})
	if err != nil {
		c.log.Debug("cannot publish whether most instances fail for this checker; retrying at the next assessment", "err", err)
		return
	}
	c.suspect = on
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
// peer that owns none), as the registry's view joins the verdicts; 1 for
// a peer whose registration says that more than half of its instances
// fail for it (it may be holding their verdicts).
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
	for _, p := range f.members {
		if p.suspect && p.id != f.self {
			out[p.id] = 1
		}
	}
	return out
}
