package health

import (
	"context"
	"errors"
	"math/rand/v2"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"google.golang.org/grpc"
)

// Runner checks one instance's address with one check until its context
// ends, and reports each change of verdict. Every wait is jittered,
// including the first (a fleet restarted at once is not probed at once):
// the first probe comes within one interval, later ones every interval
// ±10 %.
//
// A gRPC check follows the server's Watch stream, so a change is seen when
// the server pushes it: each pushed change is a result when it comes.
// Once per interval a Check on the stream's connection is one more, so
// that a server that stops answering (hung, its stream open but silent)
// fails too. Rise and fall count intervals, not results (see verdict): a
// push and the Check just after it count once, so that they mean the same
// for every kind. A server without Watch is polled with Check.
//
// A TTL check has no interval, rise or fall (runTTL): it passes at a
// report and fails once the last one is one TTL old.
type Runner struct {
	Check  beacon.Check
	Addr   string
	Prober *Prober
	// OnChange is called, from Run's goroutine, with each new status and,
	// for Failing, the last failure.
	OnChange func(Status, error)
	// OnProbe is called, from Run's goroutine, after each probe the
	// Runner makes (a Check call, an HTTP GET, a TCP connect, a TTL
	// check's judgement of its last report) with its result and how long
	// it took. Statuses a gRPC server pushes on its Watch stream are
	// results, not probes.
	OnProbe func(result error, took time.Duration)
	// OnResult is called, from Run's goroutine, with every result —
	// probes, pushed statuses, a Watch stream that broke — after the
	// verdict took it in (after OnChange, if it changed).
	OnResult func(result error)
	// Refresh, for a TTL check, is called before each judgement of the
	// last report (every beacon.TTLReadInterval, and when the last report
	// turns one TTL old): it reads the service's latest report from
	// wherever it is kept (the Checker: the store) and calls Report when
	// there is a new one. An error skips the judgement: the report could
	// not be read, which says nothing about the service. Nil: only calls
	// of Report count.
	Refresh func(ctx context.Context) error
	// Jitter returns a number in [0, 1); nil uses math/rand/v2.
	Jitter func() float64

	mu       sync.Mutex
	reported time.Time // the last Report of a TTL check (zero: none yet)
}

// Report records that a TTL check's service is fine now.
func (r *Runner) Report() {
	r.mu.Lock()
	r.reported = time.Now()
	r.mu.Unlock()
}

// Run checks until ctx ends and returns ctx's error.
func (r *Runner) Run(ctx context.Context) error {
	c := r.Check.WithDefaults()
	v := newVerdict(c)
	observe := r.observer(&v)
	if c.Kind == beacon.CheckTTL {
		return r.runTTL(ctx, c.TTL, observe)
	}
	w := grpcWatch{pushed: make(chan error, 1), done: make(chan error, 1)}
	defer w.stop()
	timer := time.NewTimer(firstWait(c.Interval, r.jitter()))
	defer timer.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case pushed := <-w.pushed:
			observe(pushed, time.Now())
			continue
		case err := <-w.done:
			if w.ended(err) && ctx.Err() == nil {
				observe(err, time.Now()) // the stream broke: the server is gone
			}
			continue
		case <-timer.C:
		}
		// The tick's time, taken before the timer is set again, is when
		// its result counts: two ticks are then at least the shortest
		// wait apart, however long their probes take.
		tick := time.Now()
		timer.Reset(nextWait(c.Interval, r.jitter()))
		if probed, result := r.probe(ctx, c, &w); probed {
			r.probed(result, tick)
			observe(result, tick)
		}
	}
}

// observer returns the function that gives v one result, and reports a
// change of verdict (OnChange) and the result (OnResult).
func (r *Runner) observer(v *verdict) func(result error, at time.Time) {
	return func(result error, at time.Time) {
		if v.observe(result, at) && r.OnChange != nil {
			r.OnChange(v.status, v.reason)
		}
		if r.OnResult != nil {
			r.OnResult(result)
		}
	}
}

// probed reports a probe that started at start (OnProbe).
func (r *Runner) probed(result error, start time.Time) {
	if r.OnProbe != nil {
		r.OnProbe(result, time.Since(start))
	}
}

// runTTL runs a TTL check until ctx ends: it passes at the first report it
// sees, fails once the last report — or, before any, the start — is one
// TTL old, and passes again at the next report. Interval, rise and fall
// do not apply: the TTL is the check's only timing. The report is read
// (Refresh) every beacon.TTLReadInterval, jittered as probes are, and
// again at the moment it would turn one TTL old, so that a check fails
// one TTL after the last report seen, and passes within one read of a new
// one.
func (r *Runner) runTTL(ctx context.Context, ttl time.Duration, observe func(error, time.Time)) error {
	every := beacon.TTLReadInterval(ttl)
	started := time.Now()
	read := time.NewTimer(firstWait(every, r.jitter()))
	defer read.Stop()
	expiry := time.NewTimer(ttl)
	defer expiry.Stop()
	for {
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-read.C:
			read.Reset(nextWait(every, r.jitter()))
		case <-expiry.C:
		}
		now := time.Now()
		if r.Refresh != nil && r.Refresh(ctx) != nil {
			continue // nothing is known of the service: no result
		}
		due, judged, result := r.ttlResult(ttl, started)
		if d := time.Until(due); d > 0 {
			expiry.Reset(d)
		}
		if judged {
			r.probed(result, now)
			observe(result, now)
		}
	}
}

// probe makes the interval's probe and returns its result; probed is
// false when the interval has no result of its own: a gRPC Watch stream
// just opened (its first push is the result).
func (r *Runner) probe(ctx context.Context, c beacon.Check, w *grpcWatch) (probed bool, result error) {
	switch {
	case c.Kind == beacon.CheckGRPC && w.watching:
		return true, withTimeout(ctx, c.Timeout, func(ctx context.Context) error { return checkGRPC(ctx, w.cc, c.Service) })
	case c.Kind == beacon.CheckGRPC && !w.unsupported:
		if err := w.start(ctx, r.Addr, c.Service); err != nil {
			return true, err
		}
		return false, nil // its first push is the result
	}
	return true, r.prober().Probe(ctx, c, r.Addr)
}

// firstWait is the wait before a check's first probe, given a jitter j in
// [0, 1): anywhere within one interval, so that checks declared together
// (a fleet restarted at once) spread over the interval.
func firstWait(interval time.Duration, j float64) time.Duration {
	return time.Duration(j * float64(interval))
}

// nextWait is the wait between probes: the interval ±10 %, so that checks
// that started together drift apart.
func nextWait(interval time.Duration, j float64) time.Duration {
	return time.Duration((0.9 + 0.2*j) * float64(interval))
}

// grpcWatch is a Runner's gRPC Watch stream: at most one runs at a time,
// owned by Run, which stops it before returning.
type grpcWatch struct {
	pushed      chan error // each status change the server pushes
	done        chan error // why the stream ended
	cc          *grpc.ClientConn
	watching    bool
	unsupported bool // the server has no Watch: poll with Check
	cancel      context.CancelFunc
}

func (w *grpcWatch) start(ctx context.Context, addr, service string) error {
	cc, err := dialGRPC(addr)
	if err != nil {
		return err
	}
	ctx, w.cancel = context.WithCancel(ctx)
	w.cc, w.watching = cc, true
	go func() { w.done <- watchGRPC(ctx, cc, service, w.pushed) }()
	return nil
}

// ended records the end of the stream and reports whether err counts as a
// failed check (a server without Watch is polled instead).
func (w *grpcWatch) ended(err error) bool {
	w.watching = false
	w.cancel()
	_ = w.cc.Close()
	if errors.Is(err, errUnimplemented) {
		w.unsupported = true
		return false
	}
	return true
}

func (w *grpcWatch) stop() {
	if w.watching {
		w.cancel()
		err := <-w.done // why it ended: the cancel above, or an error the next probe meets again
		_ = err
		_ = w.cc.Close()
		w.watching = false
	}
}

// ttlResult judges a TTL check now: due is when the last report (or,
// before any, started) turns one TTL old; after it, the check fails;
// before it, a report passes, and no report yet is no result (judged
// false: the instance stays unknown, served).
func (r *Runner) ttlResult(ttl time.Duration, started time.Time) (due time.Time, judged bool, result error) {
	r.mu.Lock()
	last := r.reported
	r.mu.Unlock()
	due = started.Add(ttl)
	if last.After(started) {
		due = last.Add(ttl)
	}
	switch {
	case !time.Now().Before(due):
		if last.IsZero() {
			return due, true, errors.New("the service has not reported since its check was first seen, one TTL (" + ttl.String() + ") ago")
		}
		return due, true, errors.New("the service has not reported within its TTL (" + ttl.String() + ")")
	case last.IsZero():
		return due, false, nil
	}
	return due, true, nil
}

func (r *Runner) prober() *Prober {
	if r.Prober == nil {
		return &Prober{}
	}
	return r.Prober
}

func (r *Runner) jitter() float64 {
	if r.Jitter != nil {
		return r.Jitter()
	}
	return rand.Float64()
}
