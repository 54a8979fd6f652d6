package etcd

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	pb "go.etcd.io/etcd/api/v3/etcdserverpb"
	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
	"google.golang.org/grpc"
)

// A member that hangs (a stopped process, a stuck disk, a VM that stalls)
// still accepts TCP connections, and gRPC keeps its connection READY until
// keep-alive pings time out (15 s or more: gRPC pings at most every 10 s).
// Meanwhile the client's round-robin balancer sends it a share of every
// call, and each such call waits for its deadline. The prober shortens
// that: when a call or a watch fails for want of an answer, it probes every
// member — its status, then a linearizable read, each member on a
// connection of its own — and leaves out of the client's endpoints those
// that do not answer both while another does (and those that know no
// leader while another does), so that new calls and watches go to the
// members that answer. It probes them again every ProbeTimeout and puts
// each back as soon as it answers both with a leader. A sweep waits for the
// members that do not answer a quarter of the timeout after another
// answered with a leader, not the whole timeout.

// prober tracks which members answer; one per Store made by Open with
// several endpoints.
type prober struct {
	all     []string        // every configured endpoint, in order
	base    clientv3.Config // of the client that asks for statuses
	timeout time.Duration
	set     func(eps ...string) // sets the main client's endpoints
	log     *slog.Logger

	wake chan struct{} // a sweep is wanted

	mu      sync.Mutex
	out     map[string]time.Time // left out, since
	pending chan struct{}        // closed when the next sweep ends
	last    time.Time            // end of the last sweep
	changed chan struct{}        // closed when out changes
	cli     *clientv3.Client     // asks for statuses; made on first use
}

// newProber probes members through a client of its own made from base
// (without logs: a failed probe is the expected outcome, not news), and
// sets the main client's endpoints with set.
func newProber(all []string, base clientv3.Config, timeout time.Duration, set func(...string), log *slog.Logger) *prober {
	base.Logger, base.LogConfig = zap.NewNop(), nil
	base.AutoSyncInterval = 0
	base.DialTimeout = timeout
	return &prober{
		all:     slices.Clone(all),
		base:    base,
		timeout: timeout,
		set:     set,
		log:     log,
		wake:    make(chan struct{}, 1),
		out:     make(map[string]time.Time),
		changed: make(chan struct{}),
	}
}

// suspect asks for a sweep of every member and returns a channel closed
// when it has ended. It never blocks.
func (p *prober) suspect() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending = make(chan struct{})
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return p.pending
}

// excluded returns the endpoints left out now, sorted.
func (p *prober) excluded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.out))
	for ep := range p.out {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}

// run sweeps when asked and probes the members left out every timeout,
// until stop is closed.
func (p *prober) run(stop <-chan struct{}) {
	defer func() {
		if p.cli != nil {
			_ = p.cli.Close()
		}
	}()
	t := time.NewTicker(p.timeout)
	defer t.Stop()
	for {
		select {
		case <-stop:
			p.mu.Lock()
			if p.pending != nil {
				close(p.pending)
				p.pending = nil
			}
			p.mu.Unlock()
			return
		case <-p.wake:
			// At most one sweep per timeout: a flood of failed calls (the
			// whole cluster down) costs one probe per member per timeout.
			p.mu.Lock()
			wait := time.Until(p.last.Add(p.timeout))
			p.mu.Unlock()
			if wait > 0 {
				select {
				case <-stop:
					continue
				case <-time.After(wait):
				}
			}
			p.sweep(stop)
		case <-t.C:
			if len(p.excluded()) > 0 {
				p.recheck(stop)
			}
		}
	}
}

// sweep probes the members in use and leaves out those that do not
// answer while another does, and those that answer without a leader while
// another has one.
func (p *prober) sweep(stop <-chan struct{}) {
	p.mu.Lock()
	done := p.pending
	p.pending = nil
	var in []string
	for _, ep := range p.all {
		if _, ok := p.out[ep]; !ok {
			in = append(in, ep)
		}
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.last = time.Now()
		p.mu.Unlock()
		if done != nil {
			close(done)
		}
	}()
	got := p.probeAll(stop, in)
	answered, led := false, false
	for _, g := range got {
		answered = answered || g != silent
		led = led || g == healthy
	}
	var bad []string
	for i, ep := range in {
		if (got[i] == silent && answered) || (got[i] == leaderless && led) {
			bad = append(bad, ep)
		}
	}
	if len(bad) == 0 {
		return // all answer, or none does: nothing to choose between
	}
	p.mu.Lock()
	now := time.Now()
	for _, ep := range bad {
		p.out[ep] = now
	}
	p.mu.Unlock()
	p.apply()
	p.log.Warn("etcd member does not answer (or has no leader); sending calls and watches to the other members until it does",
		"members", bad, "probe_timeout", p.timeout)
}

// recheck probes the members left out and puts back those that answer.
func (p *prober) recheck(stop <-chan struct{}) {
	out := p.excluded()
	got := p.probeAll(stop, out)
	var back []string
	p.mu.Lock()
	for i, ep := range out {
		if got[i] == healthy {
			back = append(back, ep)
			delete(p.out, ep)
		}
	}
	p.mu.Unlock()
	if len(back) == 0 {
		return
	}
	p.apply()
	p.log.Info("etcd member answers again; sending it calls again", "members", back)
}

// changes returns a channel closed at the next change of the members left
// out.
func (p *prober) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// apply sets the main client's endpoints to those not left out.
func (p *prober) apply() {
	p.mu.Lock()
	var in []string
	for _, ep := range p.all {
		if _, ok := p.out[ep]; !ok {
			in = append(in, ep)
		}
	}
	defer func() {
		p.mu.Lock()
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}()
	p.mu.Unlock()
	if len(in) == 0 {
		in = p.all
	}
	p.set(in...)
}

// A probe's outcome.
type probeResult uint8

const (
	silent     probeResult = iota // no answer within the timeout
	leaderless                    // answers, but knows no leader
	healthy                       // answers, and follows a leader
)

// probeAll probes eps in parallel.
func (p *prober) probeAll(stop <-chan struct{}, eps []string) []probeResult {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	got := make([]probeResult, len(eps))
	p.mu.Lock()
	if p.cli == nil {
		// Made here, in the prober's goroutine: with credentials, Open
		// authenticates (bounded by the probe timeout).
		p.mu.Unlock()
		cli, err := clientv3.New(p.base)
		if err != nil {
			return got // all silent: nothing to choose between
		}
		p.mu.Lock()
		p.cli = cli
	}
	p.mu.Unlock()
	// A member that has not answered a while after another answered with
	// a leader is not waited for until the timeout: a quarter of it (or
	// twice the time the first answer took, if longer) tells a hung member
	// from a slow one, and every call meanwhile may be sent to it. One
	// left out wrongly is put back at the next recheck.
	type answer struct {
		i int
		r probeResult
	}
	answers := make(chan answer, len(eps))
	start := time.Now()
	for i, ep := range eps {
		go func() { answers <- answer{i, p.probe(ctx, ep)} }()
	}
	cut := false
	for range eps { // every probe answers: the goroutines end here
		a := <-answers
		got[a.i] = a.r
		if a.r == healthy && !cut {
			cut = true
			t := time.AfterFunc(max(p.timeout/4, 2*time.Since(start)), cancel)
			defer t.Stop()
		}
	}
	return got
}

// probe asks the member at ep alone, on a connection of its own, for its
// status and then for a linearizable read of probeKey: a stopped or
// cut-off member answers neither, and one cut off from its peers (or in an
// election) knows no leader. The status is the member's own: it answers
// even when the cluster has no leader, so that a hung leader is told apart
// from the election that replaces it. The read is what calls need: a
// member can answer its status at once and still serve nothing in time —
// one back from a partition whose requests to the leader do not get
// through yet, one whose disk is slow (its reads wait for its raft log to
// be applied) — and such a member must stay out too (both were seen to
// cost the HTTP API's heartbeats their leases).
func (p *prober) probe(ctx context.Context, ep string) probeResult {
	p.mu.Lock()
	cli := p.cli
	p.mu.Unlock()
	if cli == nil {
		return silent
	}
	conn, err := cli.Dial(ep) // ep alone
	if err != nil {
		return silent
	}
	defer conn.Close()
	st, err := pb.NewMaintenanceClient(conn).Status(ctx, &pb.StatusRequest{}, grpc.WaitForReady(true))
	switch {
	case denied(err):
		// It answered; the user may not read its status. The read below
		// tells whether it serves.
	case err != nil:
		return silent
	case st.Leader == 0:
		return leaderless
	}
	_, err = pb.NewKVClient(conn).Range(ctx, &pb.RangeRequest{Key: []byte(probeKey), CountOnly: true}, grpc.WaitForReady(true))
	if err != nil && !denied(err) {
		return silent
	}
	return healthy
}

// denied reports etcd's refusal of a request for want of permission: the
// member answered.
func denied(err error) bool {
	return err != nil && errors.Is(rpctypes.Error(err), rpctypes.ErrPermissionDenied)
}
