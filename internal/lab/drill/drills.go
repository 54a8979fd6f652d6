package drill

import (
	"context"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/internal/lab/netcut"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/store"
)

// electionTimeout is etcd's default election timeout: a new leader extends
// every lease by it (lessor.Promote).
const electionTimeout = time.Second

// runner runs drills, reusing one cluster per size.
type runner struct {
	cfg      Config
	clusters map[int]*etcdproc.Cluster
	seq      int
}

func (r *runner) close() {
	for _, c := range r.clusters {
		c.Close()
	}
}

// cluster returns the running cluster of n members, starting it first.
func (r *runner) cluster(ctx context.Context, n int) (*etcdproc.Cluster, error) {
	if c := r.clusters[n]; c != nil {
		return c, nil
	}
	nw, err := r.cfg.Network()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(r.cfg.Dir, fmt.Sprintf("cluster%d", n))
	if err := os.MkdirAll(dir, 0o755); err != nil {
		nw.Close()
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	c, err := etcdproc.StartCluster(sctx, r.cfg.Members, nw, n, dir)
	if err != nil {
		return nil, err
	}
	if r.clusters == nil {
		r.clusters = map[int]*etcdproc.Cluster{}
	}
	r.clusters[n] = c
	return c, nil
}

// healthy waits until every member of c answers /health.
func healthy(ctx context.Context, c *etcdproc.Cluster) error {
	ctx, cancel := context.WithTimeout(ctx, time.Minute)
	defer cancel()
	for _, m := range c.Members() {
		if err := m.WaitHealthy(ctx); err != nil {
			return err
		}
	}
	return nil
}

// fault is what a trial does to the cluster.
type fault struct {
	// inject starts the fault (at the victim's death) and describes it.
	inject func(ctx context.Context, trial int) (string, error)
	// heal ends it, hold after inject.
	heal func(ctx context.Context) error
	hold time.Duration
	// onFollower, if set, reports whether the fault injected last is on a
	// follower, whose goal assumes that the leader stays (see excuse).
	onFollower func() bool
}

// env is a drill's fleet and watchers on one cluster.
type env struct {
	c        *etcdproc.Cluster
	ns       string
	fleet    *fleet
	watchers []*watcher
	ref      *reference // when etcd deleted what
	// revokedMark is how many leases etcd had revoked although renewed in
	// time when the trial began (fleet.revokedRefs).
	revokedMark int
}

// key returns the store key of an instance ref.
func (e *env) key(ref string) string { return "/services/" + ref }

func (r *runner) newEnv(ctx context.Context, c *etcdproc.Cluster) (*env, error) {
	r.seq++
	ns := fmt.Sprintf("drill-%d-%d", os.Getpid()%100000, r.seq)
	fl, err := r.newFleet(ctx, c.Endpoints(), ns)
	if err != nil {
		return nil, err
	}
	e := &env{c: c, ns: ns, fleet: fl, ref: newReference(c, "/services/"+ns+"/")}
	for i := range r.cfg.Watchers {
		w, err := r.newWatcher(ctx, fmt.Sprintf("w%d", i+1), c.Endpoints(), ns)
		if err != nil {
			e.close()
			return nil, err
		}
		e.watchers = append(e.watchers, w)
	}
	if err := e.converge(ctx, e.watchers, time.Minute); err != nil {
		e.close()
		return nil, err
	}
	return e, nil
}

// converge waits until ws list exactly the fleet.
func (e *env) converge(ctx context.Context, ws []*watcher, within time.Duration) error {
	ctx, cancel := context.WithTimeout(ctx, within)
	defer cancel()
	want := e.fleet.want()
	for _, w := range ws {
		w.expect(want)
		if err := w.waitFor(ctx, "the live fleet", func(w *watcher) bool { return !w.converged.IsZero() }); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) close() {
	for _, w := range e.watchers {
		w.close()
	}
	e.fleet.close()
	e.ref.close()
}

// run runs one drill.
func (r *runner) run(ctx context.Context, name string) (Result, error) {
	res := Result{Drill: name, Quorum: true, Members: 3}
	switch name {
	case SinglePause, SingleRestart:
		res.Members, res.Quorum = 1, false
	}
	c, err := r.cluster(ctx, res.Members)
	if err != nil {
		return res, err
	}
	if name == Partition && !c.Network().IsNetns() {
		res.Skipped = "members are on loopback, not in network namespaces (those need root and iproute2)"
		return res, nil
	}
	if err := healthy(ctx, c); err != nil {
		return res, err
	}
	e, err := r.newEnv(ctx, c)
	if err != nil {
		return res, err
	}
	defer e.close()
	trials := r.cfg.Trials
	if name == MemberHang || name == Partition {
		trials = max(trials, 2) // a follower and the leader
	}
	fmt.Fprintf(r.cfg.Progress, "drill %s: %d trial(s), %s, %d steady sessions, %d watchers, TTL %v\n",
		name, trials, r.cfg.Members.Name(), r.cfg.Sessions, r.cfg.Watchers, r.cfg.TTL)
	for t := range trials {
		var err error
		switch name {
		case Compaction:
			err = r.compactionTrial(ctx, e, t, &res)
		case SlowConsumer:
			err = r.slowTrial(ctx, e, t, &res)
		default:
			err = r.trial(ctx, e, t, r.faultOf(name, c), &res)
		}
		if err != nil {
			return res, fmt.Errorf("trial %d: %w", t+1, err)
		}
		res.Trials++
	}
	return res, nil
}

// memberFault holds a member of c for 2 TTL in the state act puts it in
// (what says which), then heal brings it back: a follower in even trials,
// the leader in odd ones.
func (r *runner) memberFault(c *etcdproc.Cluster, act, heal func(*etcdproc.Member) error, what string) fault {
	var target *etcdproc.Member
	var onFollower bool
	return fault{hold: 2 * r.cfg.TTL,
		inject: func(ctx context.Context, trial int) (string, error) {
			m, role, err := pickMember(ctx, c, trial)
			if err != nil {
				return "", err
			}
			target, onFollower = m, role == "follower"
			return role + " " + m.Name + " " + what, act(m)
		},
		heal:       func(context.Context) error { return heal(target) },
		onFollower: func() bool { return onFollower }}
}

// pickMember is a follower of c in even trials, its leader in odd ones,
// and which it is.
func pickMember(ctx context.Context, c *etcdproc.Cluster, trial int) (*etcdproc.Member, string, error) {
	leader, err := c.WaitLeader(ctx)
	if err != nil {
		return nil, "", err
	}
	if trial%2 == 1 {
		return leader, "leader", nil
	}
	for _, m := range c.Members() {
		if m != leader {
			return m, "follower", nil
		}
	}
	return leader, "leader", nil
}

// faultOf returns the fault of a drill.
func (r *runner) faultOf(name string, c *etcdproc.Cluster) fault {
	ttl := r.cfg.TTL
	var target *etcdproc.Member
	switch name {
	case SinglePause:
		m := c.Members()[0]
		return fault{hold: 2 * ttl,
			inject: func(context.Context, int) (string, error) { return "member stopped (SIGSTOP)", m.Pause() },
			heal:   func(context.Context) error { return m.Resume() }}
	case SingleRestart:
		m := c.Members()[0]
		return fault{hold: 2 * ttl,
			inject: func(context.Context, int) (string, error) { return "member killed (SIGKILL)", m.Kill() },
			heal:   func(context.Context) error { return m.Restart() }}
	case LeaderKill:
		return fault{hold: 2 * ttl,
			inject: func(ctx context.Context, _ int) (string, error) {
				leader, err := c.WaitLeader(ctx)
				if err != nil {
					return "", err
				}
				target = leader
				return "leader " + leader.Name + " killed (SIGKILL)", leader.Kill()
			},
			heal: func(context.Context) error { return target.Restart() }}
	case MemberHang:
		return r.memberFault(c, (*etcdproc.Member).Pause, (*etcdproc.Member).Resume, "stopped (SIGSTOP)")
	case Partition:
		return r.memberFault(c, (*etcdproc.Member).Partition, (*etcdproc.Member).Heal, "cut off (link down)")
	}
	return fault{ // SIGKILL: the victim's death is the whole fault
		inject: func(context.Context, int) (string, error) { return "registrant killed (SIGKILL)", nil },
		heal:   func(context.Context) error { return nil }}
}

// leaderWatch records when a member other than the leader at the start
// becomes leader (a new leader extends every lease).
type leaderWatch struct {
	mu   sync.Mutex
	at   time.Time
	stop func()
	done chan struct{}
}

func watchLeader(ctx context.Context, c *etcdproc.Cluster) *leaderWatch {
	lw := &leaderWatch{done: make(chan struct{})}
	if len(c.Members()) < 2 {
		close(lw.done)
		lw.stop = func() {}
		return lw
	}
	before, _ := c.Leader(ctx)
	ctx, cancel := context.WithCancel(ctx)
	lw.stop = func() { cancel(); <-lw.done }
	go func() {
		defer close(lw.done)
		for {
			select {
			case <-ctx.Done():
				return
			case <-time.After(100 * time.Millisecond):
			}
			m, err := c.Leader(ctx)
			if err == nil && m != before {
				lw.mu.Lock()
				lw.at = time.Now()
				lw.mu.Unlock()
				return
			}
		}
	}()
	return lw
}

func (lw *leaderWatch) takeover() time.Time {
	lw.mu.Lock()
	defer lw.mu.Unlock()
	return lw.at
}

// sleepCtx waits d: the fault's duration is part of the drill.
func sleepCtx(ctx context.Context, d time.Duration) error {
	if !wait.Sleep(ctx, d) {
		return ctx.Err()
	}
	return nil
}

// trial runs one trial of a fault drill: start a victim, inject the fault
// and kill the victim, hold, heal, and wait until every watcher lists
// exactly the fleet.
func (r *runner) trial(ctx context.Context, e *env, n int, f fault, res *Result) error {
	ts, err := r.startTrial(ctx, e, e.watchers, n)
	if err != nil {
		return err
	}
	v := ts.v
	defer v.kill()
	lw := watchLeader(ctx, e.c)
	defer lw.stop() // idempotent: stopped below before the takeover is read
	counted := *res
	ft, err := r.runFault(ctx, e, n, f, v)
	if err != nil {
		return err
	}
	desc, t0, healAt := ft.desc, ft.t0, ft.healAt
	// After an outage, the leases' clock starts again when a leader is
	// back (a restarted member extends every lease as it takes over).
	var leaderBack time.Time
	if !res.Quorum {
		lctx, lcancel := context.WithTimeout(ctx, time.Minute)
		_, err := e.c.WaitLeader(lctx)
		lcancel()
		if err != nil {
			return err
		}
		leaderBack = time.Now()
	}
	wctx, cancel := context.WithTimeout(ctx, 3*r.cfg.TTL+30*time.Second)
	defer cancel()
	for _, w := range e.watchers {
		if err := w.waitFor(wctx, "the live fleet after the fault", func(w *watcher) bool {
			_, gone := w.goneAt[v.id]
			return !w.converged.IsZero() && gone
		}); err != nil {
			return fmt.Errorf("%w (%s): %w", errNoConvergence, desc, err)
		}
	}
	if err := healthy(ctx, e.c); err != nil {
		return err
	}
	lw.stop()
	ref := t0
	if !res.Quorum {
		ref = healAt
	}
	// The victim's lease runs until TTL after its death; etcd could not
	// expire it while it had no quorum, and a new leader extends it.
	start := t0
	if !res.Quorum {
		start = leaderBack.Add(electionTimeout)
	}
	if to := lw.takeover(); !to.IsZero() && to.Add(electionTimeout).After(start) {
		start = to.Add(electionTimeout)
	}
	bound := start.Add(r.cfg.TTL + time.Second)
	r.scoreTimes(e, e.watchers, v.id, t0, ref, bound, res)
	// The fault's aftermath belongs to the trial: a resumed or restarted
	// member may still act on what it missed (etcd revokes the leases it
	// believes expired). Watch one more TTL, let every session that lost
	// its lease recover (a loss counts once its recovery tells whether
	// etcd kept the lease), and only then count losses and flaps.
	if err := sleepCtx(ctx, r.cfg.TTL); err != nil {
		return err
	}
	actx, cancel2 := context.WithTimeout(ctx, 3*r.cfg.TTL+30*time.Second)
	defer cancel2()
	if err := e.fleet.active(actx); err != nil {
		return err
	}
	if err := e.converge(ctx, e.watchers, time.Minute); err != nil {
		return err
	}
	r.scoreFlaps(e, e.watchers, res)
	r.finishTrial(e, n, ts, res)
	if f.onFollower != nil && f.onFollower() && ft.elections > 0 {
		excuse(n, ft.elections, counted, res)
	}
	takeover := ""
	if to := lw.takeover(); !to.IsZero() {
		takeover = fmt.Sprintf(", new leader %v after the fault", to.Sub(t0).Round(10*time.Millisecond))
	}
	fmt.Fprintf(r.cfg.Progress, "  trial %d: %s; victim gone from every watcher after %v%s; converged %v; so far lost %d, revoked %d, flaps %d\n",
		n+1, desc, round(res.Removal[len(res.Removal)-1]), takeover, round(res.Converge[len(res.Converge)-1]),
		res.Lost, res.Revoked, res.Flaps)
	return nil
}

// faulted is what running a trial's fault found.
type faulted struct {
	desc   string
	t0     time.Time // the fault's start and the victim's death
	healAt time.Time
	// elections: raft terms the members went through while the fault
	// lasted (-1: a reading failed).
	elections int
}

// runFault injects f and kills the victim v (every watcher now expects
// the fleet without it), holds the fault and heals it, reading etcd's
// raft term at both ends.
func (r *runner) runFault(ctx context.Context, e *env, n int, f fault, v *victim) (faulted, error) {
	want := e.fleet.want()
	term0, termErr := e.c.Term(ctx)
	out := faulted{t0: time.Now(), elections: -1}
	desc, err := f.inject(ctx, n)
	if err != nil {
		return out, err
	}
	out.desc = desc
	v.kill()
	for _, w := range e.watchers {
		w.expect(want)
	}
	if err := sleepCtx(ctx, f.hold); err != nil {
		return out, err
	}
	if term1, err := e.c.Term(ctx); err == nil && termErr == nil {
		out.elections = int(term1 - term0)
	}
	out.healAt = time.Now()
	return out, f.heal(ctx)
}

// excuse takes the lost leases and flaps of trial n, a fault on a
// follower during which the members elected a leader, out of the goal
// (ExcusedLost, ExcusedFlaps), and notes why: a follower's fault moves no
// leader on a machine that gives etcd its heartbeats in time (etcd
// campaigns with pre-vote), and the TTL is derived for a steady leader; a
// machine too busy for that (CI, with another package's tests on both
// cores) ends leases whatever the client does. before is res as the trial
// began.
func excuse(n, elections int, before Result, res *Result) {
	lost := res.Lost - before.Lost
	flaps := (res.Flaps - before.Flaps) - (res.RevokedFlaps - before.RevokedFlaps)
	if lost == 0 && flaps == 0 {
		return
	}
	res.ExcusedLost += lost
	res.ExcusedFlaps += flaps
	res.Notes = append(res.Notes, fmt.Sprintf("trial %d: the members elected a leader %d time(s) during a fault of a follower, which moves none when etcd's heartbeats arrive in time: its %d lost lease(s) and %d flap(s) do not count against the goal", n+1, elections, lost, flaps))
}

// countLosses adds the lease losses since a trial began.
func (r *runner) countLosses(e *env, n int, before [3]int, whyBefore int, res *Result) {
	lost, kept, revoked := e.fleet.lostCount()
	res.Lost += lost - before[0]
	res.Kept += kept - before[1]
	res.Revoked += revoked - before[2]
	if k := revoked - before[2]; k > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: etcd revoked %d lease(s) that their sessions had renewed in time (a resumed etcd leader revokes the leases it believes expired); the sessions re-registered", n+1, k))
	}
	if k := kept - before[1]; k > 0 {
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: %d session(s) reported their lease lost by their own clock (no keep-alive answered for a TTL) and found, recovering, that etcd had kept it", n+1, k))
	}
	e.fleet.mu.Lock()
	defer e.fleet.mu.Unlock()
	shown := 0
	for _, why := range e.fleet.why[whyBefore:] {
		if strings.Contains(why, "found etcd had kept it") || strings.Contains(why, "renewed in time") {
			continue
		}
		if shown++; shown > 5 {
			continue
		}
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: %s", n+1, why))
	}
	if shown > 5 {
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: ... and %d more lost lease(s)", n+1, shown-5))
	}
}

// seen waits until every watcher lists ref.
// trialStart is what a trial notes before its fault: its victim, and
// the counters its result is the difference of.
type trialStart struct {
	v                       *victim
	lost                    [3]int // lost, kept, revoked
	why, stale, unconfirmed int
}

// startTrial starts a victim, waits until every watcher of all lists it,
// notes the counters and marks the victim in every watcher.
func (r *runner) startTrial(ctx context.Context, e *env, all []*watcher, n int) (*trialStart, error) {
	v, err := r.startVictim(ctx, e.c.Endpoints(), e.ns, n)
	if err != nil {
		return nil, err
	}
	if err := seen(ctx, all, v.id); err != nil {
		v.kill()
		return nil, err
	}
	lost, kept, revoked := e.fleet.lostCount()
	ts := &trialStart{v: v, lost: [3]int{lost, kept, revoked}, why: e.fleet.whyCount(), stale: e.stale(),
		unconfirmed: e.fleet.unconfirmedCount()}
	e.fleet.mu.Lock()
	e.revokedMark = len(e.fleet.revokedRefs)
	e.fleet.mu.Unlock()
	for _, w := range all {
		w.mark(v.id)
	}
	return ts, nil
}

// finishTrial adds what happened since startTrial to res.
func (r *runner) finishTrial(e *env, n int, ts *trialStart, res *Result) {
	r.countLosses(e, n, ts.lost, ts.why, res)
	res.Stale += e.stale() - ts.stale
	if k := e.fleet.unconfirmedCount() - ts.unconfirmed; k > 0 {
		res.Unconfirmed += k
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: %d session(s) had no renewal answered for a whole TTL and reported their lease unconfirmed (not lost) until a renewal succeeded or etcd answered", n+1, k))
	}
}

// seen waits until every watcher lists ref.
func seen(ctx context.Context, watchers []*watcher, ref string) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	for _, w := range watchers {
		if err := w.waitFor(ctx, "the new registrant", func(w *watcher) bool { _, ok := w.view[ref]; return ok }); err != nil {
			return err
		}
	}
	return nil
}

func (e *env) stale() int {
	n := 0
	for _, w := range e.watchers {
		w.mu.Lock()
		n += w.stale
		w.mu.Unlock()
	}
	return n
}

// score adds a trial's phantoms, flaps, removal and convergence times.
func (r *runner) score(e *env, ws []*watcher, victim string, t0, ref, bound time.Time, res *Result) {
	r.scoreTimes(e, ws, victim, t0, ref, bound, res)
	r.scoreFlaps(e, ws, res)
}

// lagLimit is how far a watcher may trail etcd's own deletion before a
// late removal counts against it rather than against etcd.
const lagLimit = time.Second

// scoreTimes adds a trial's phantoms, removal, lag and convergence times.
// A watcher that listed the dead registrant past the bound is a phantom
// when it trailed etcd's deletion by more than lagLimit; one that followed
// etcd within lagLimit counts as Late (etcd's expiry and delivery under
// load took the time).
func (r *runner) scoreTimes(e *env, ws []*watcher, victim string, t0, ref, bound time.Time, res *Result) {
	var removal, converge, lag time.Duration
	storeGone := e.ref.deletedAt(e.key(victim))
	for _, w := range ws {
		w.mu.Lock()
		gone := w.goneAt[victim]
		behind := time.Duration(0)
		if !storeGone.IsZero() {
			behind = gone.Sub(storeGone)
		}
		lag = max(lag, behind)
		if gone.After(bound) {
			if storeGone.IsZero() || behind > lagLimit {
				res.Phantom++
				res.Notes = append(res.Notes, fmt.Sprintf("trial %d: watcher %s listed the dead registrant %v after its death (bound %v), %v after etcd deleted it",
					res.Trials+1, w.name, gone.Sub(t0).Round(10*time.Millisecond), bound.Sub(t0).Round(10*time.Millisecond), behind.Round(10*time.Millisecond)))
			} else {
				res.Late++
				res.Notes = append(res.Notes, fmt.Sprintf("trial %d: watcher %s listed the dead registrant %v after its death (bound %v), %v after etcd deleted its key (%v after the death)",
					res.Trials+1, w.name, gone.Sub(t0).Round(10*time.Millisecond), bound.Sub(t0).Round(10*time.Millisecond),
					behind.Round(10*time.Millisecond), storeGone.Sub(t0).Round(10*time.Millisecond)))
			}
		}
		removal = max(removal, gone.Sub(t0))
		converge = max(converge, w.converged.Sub(ref))
		w.mu.Unlock()
	}
	res.Removal = append(res.Removal, removal)
	res.Converge = append(res.Converge, converge)
	res.Lag = append(res.Lag, lag)
}

// scoreFlaps adds the removals of live instances the watchers saw, and
// apart those of instances whose lease etcd revoked in the trial although
// their session renewed it in time.
func (r *runner) scoreFlaps(e *env, ws []*watcher, res *Result) {
	steady := e.fleet.want()
	revoked := map[string]bool{}
	e.fleet.mu.Lock()
	for _, ref := range e.fleet.revokedRefs[min(e.revokedMark, len(e.fleet.revokedRefs)):] {
		revoked[ref] = true
	}
	e.fleet.mu.Unlock()
	byRevocation := 0
	for _, w := range ws {
		w.mu.Lock()
		flaps, example := 0, ""
		for id, n := range w.removals {
			if _, ok := steady[id]; ok {
				flaps += n
				example = id
				if revoked[id] {
					byRevocation += n
				}
			}
		}
		if flaps > 0 {
			res.Flaps += flaps
			res.Notes = append(res.Notes, fmt.Sprintf("trial %d: watcher %s saw %d removal(s) of live instances (%s, ...)", res.Trials+1, w.name, flaps, example))
		}
		w.mu.Unlock()
	}
	if byRevocation > 0 {
		res.RevokedFlaps += byRevocation
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: %d of those removals were of instances whose lease etcd revoked although renewed in time (%d lease(s): fewer than the removal hold's burst of 5, so watchers saw them go and come back)",
			res.Trials+1, byRevocation, len(revoked)))
	}
}

// startTrialWith opens one extra watcher, name, through endpoints, waits
// until it and the steady watchers agree, and starts trial n with all of
// them. The caller closes the extra watcher.
func (r *runner) startTrialWith(ctx context.Context, e *env, name string, endpoints []string, n int) (*watcher, *trialStart, error) {
	extra, err := r.newWatcher(ctx, name, endpoints, e.ns)
	if err != nil {
		return nil, nil, err
	}
	all := append([]*watcher{extra}, e.watchers...)
	var ts *trialStart
	if err = e.converge(ctx, all, time.Minute); err == nil {
		ts, err = r.startTrial(ctx, e, all, n)
	}
	if err != nil {
		extra.close()
		return nil, nil, err
	}
	return extra, ts, nil
}

// compactionTrial cuts one extra watcher off; meanwhile the victim dies,
// an instance changes address, a new one registers, and etcd compacts its
// history past the cut watcher's position. Healed, that watcher must
// deliver exactly the difference.
func (r *runner) compactionTrial(ctx context.Context, e *env, n int, res *Result) error {
	first := e.c.Members()[0]
	p, err := netcut.Start(strings.TrimPrefix(first.ClientURL, "http://"))
	if err != nil {
		return err
	}
	defer p.Close()
	cut, ts, err := r.startTrialWith(ctx, e, "cut", []string{p.Endpoint()}, n)
	if err != nil {
		return err
	}
	defer cut.close()
	all := append([]*watcher{cut}, e.watchers...)
	v := ts.v
	defer v.kill()
	t0 := time.Now()
	p.Cut()
	v.kill()
	if err := e.fleet.update(ctx, 0, fmt.Sprintf("10.56.%d.1:7000", n%250)); err != nil {
		return err
	}
	newcomer, err := e.fleet.regs[1].Register(ctx, beacon.Instance{Namespace: e.ns, Component: "newcomer", Endpoint: "rpc",
		Address: fmt.Sprintf("10.57.%d.1:7000", n%250), Transport: "tcp"})
	if err != nil {
		return err
	}
	defer func() { _ = newcomer.Close() }()
	// Wait until the connected watchers saw the victim go (its lease
	// expired), then compact everything so far.
	wctx, cancel := context.WithTimeout(ctx, 3*r.cfg.TTL+30*time.Second)
	defer cancel()
	for _, w := range e.watchers {
		if err := w.waitFor(wctx, "the victim's expiry", func(w *watcher) bool { _, ok := w.view[v.id]; return !ok }); err != nil {
			return err
		}
	}
	st, err := r.openStore(ctx, e.c.Endpoints())
	if err != nil {
		return err
	}
	defer st.Close()
	_, rev, err := st.List(ctx, "/")
	if err != nil {
		return err
	}
	if err := st.Compact(ctx, rev); err != nil && !errors.Is(err, store.ErrCompacted) {
		return err
	}
	healAt := time.Now()
	p.Restore()
	want := e.fleet.want()
	want[newcomer.Instance().Ref().String()] = newcomer.Instance().Address
	for _, w := range all {
		w.expect(want)
	}
	for _, w := range all {
		if err := w.waitFor(wctx, "the difference after the cut", func(w *watcher) bool { return !w.converged.IsZero() }); err != nil {
			return fmt.Errorf("%w: %w", errNoConvergence, err)
		}
	}
	// The cut watcher is scored from the heal (it could not know before);
	// the connected ones from the victim's death.
	// Its bound allows one second more than the others': removals its
	// re-listing finds just after the store came back are held as long as
	// the registrants' TTL allows (3 s at TTL 3 s, at most TTL + 1 s)
	// before they are delivered, and the re-listing itself takes its time.
	r.score(e, []*watcher{cut}, v.id, healAt, healAt, healAt.Add(r.cfg.TTL+2*time.Second), res)
	cutConverge := res.Converge[len(res.Converge)-1]
	res.Converge, res.Removal = res.Converge[:len(res.Converge)-1], res.Removal[:len(res.Removal)-1]
	r.score(e, e.watchers, v.id, t0, t0, t0.Add(r.cfg.TTL+time.Second), res)
	res.Converge[len(res.Converge)-1] = cutConverge
	r.finishTrial(e, n, ts, res)
	cut.mu.Lock()
	cutStale := cut.stale
	cut.mu.Unlock()
	res.Stale += cutStale
	fmt.Fprintf(r.cfg.Progress, "  trial %d: a watcher cut off while 1 died, 1 moved, 1 joined and history was compacted; it converged %v after the heal (stale batches %d); flaps %d\n",
		n+1, round(cutConverge), cutStale, res.Flaps)
	if err := newcomer.Close(); err != nil {
		return err
	}
	return e.converge(ctx, e.watchers, time.Minute)
}

// slowTrial holds one extra watcher still while every steady instance
// changes address 50 times and the victim dies; released, it must catch up
// with at most one event per changed instance, and every other watcher
// must have had every change meanwhile.
func (r *runner) slowTrial(ctx context.Context, e *env, n int, res *Result) error {
	slow, ts, err := r.startTrialWith(ctx, e, "slow", e.c.Endpoints(), n)
	if err != nil {
		return err
	}
	defer slow.close()
	v := ts.v
	defer v.kill()
	slow.held.Hold()
	t0 := time.Now()
	v.kill()
	const rounds = 50
	var wg sync.WaitGroup
	errs := make(chan error, len(e.fleet.insts))
	for i := range e.fleet.insts {
		wg.Go(func() {
			for k := range rounds {
				if err := e.fleet.update(ctx, i, fmt.Sprintf("10.%d.%d.%d:7000", 60+k/250, k%250, i%250+1)); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return err
	}
	want := e.fleet.want()
	for _, w := range e.watchers {
		w.expect(want)
	}
	wctx, cancel := context.WithTimeout(ctx, 3*r.cfg.TTL+30*time.Second)
	defer cancel()
	for _, w := range e.watchers {
		if err := w.waitFor(wctx, "every change", func(w *watcher) bool {
			_, gone := w.goneAt[v.id]
			return !w.converged.IsZero() && gone
		}); err != nil {
			return fmt.Errorf("%w: %w", errNoConvergence, err)
		}
	}
	slow.mu.Lock()
	before, beforeBatches := slow.events, slow.batches
	slow.mu.Unlock()
	released := time.Now()
	slow.expect(want)
	slow.held.Release()
	if err := slow.waitFor(wctx, "the final state", func(w *watcher) bool { return !w.converged.IsZero() }); err != nil {
		return fmt.Errorf("%w: %w", errNoConvergence, err)
	}
	slow.mu.Lock()
	caughtUp, batches := slow.events-before, slow.convBatch-beforeBatches
	slow.mu.Unlock()
	r.score(e, e.watchers, v.id, t0, t0, t0.Add(r.cfg.TTL+time.Second), res)
	r.score(e, []*watcher{slow}, v.id, released, released, released.Add(r.cfg.TTL+time.Second), res)
	slowConverge := res.Converge[len(res.Converge)-1]
	res.Converge, res.Removal = res.Converge[:len(res.Converge)-1], res.Removal[:len(res.Removal)-1]
	res.Converge[len(res.Converge)-1] = slowConverge
	r.finishTrial(e, n, ts, res)
	// It sat on the batch it had taken; then a few batches (its own feed
	// may still be catching up) bring it to the final state, with at most
	// one event per changed instance in each: never one per change.
	if limit := 3 * (len(e.fleet.insts) + 1); caughtUp > limit {
		res.Notes = append(res.Notes, fmt.Sprintf("trial %d: the slow watcher caught up with %d events in %d batches for %d changed instances",
			n+1, caughtUp, batches, len(e.fleet.insts)+1))
		res.Flaps++ // more than the difference: count it against the goal
	}
	fmt.Fprintf(r.cfg.Progress, "  trial %d: %d changes while one watcher sat on a batch; it caught up in %v with %d events in %d batches; flaps %d\n",
		n+1, rounds*len(e.fleet.insts)+1, round(slowConverge), caughtUp, batches, res.Flaps)
	return nil
}
