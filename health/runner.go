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
// for every kind. A server without Watch is polled with Check. A TTL
// check counts a failure for every interval in which the last Report is
// older than the TTL.
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
	// Refresh, for a TTL check, is called once per interval before the
	// last report's age is judged: it reads the service's latest report
	// from wherever it is kept (the Checker: the store) and calls Report
	// when there is a new one. An error skips the interval: the report
	// could not be read, which says nothing about the service. Nil: only
	// calls of Report count.
	Refresh func(ctx context.Context) error
	// Jitter returns a number in [0, 1); nil uses math/rand/v2.
	Jitter func() float64

	mu       sync.Mutex
	reported time.Time // the last Report of a TTL check
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
		r.Report() // a TTL check starts with one TTL of grace
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

// probe makes the interval's probe and returns its result; probed is
// false when the interval has no result of its own: a gRPC Watch stream
// just opened (its first push is the result), a TTL report that could not
// be read.
func (r *Runner) probe(ctx context.Context, c beacon.Check, w *grpcWatch) (probed bool, result error) {
	switch {
	case c.Kind == beacon.CheckTTL:
		if r.Refresh != nil && r.Refresh(ctx) != nil {
			return false, nil
		}
		return true, r.ttlResult(c.TTL)
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
func (r *Runner) ttlResult(ttl time.Duration) error {
	r.mu.Lock()
	age := time.Since(r.reported)
	r.mu.Unlock()
	if age > ttl {
		return errors.New("the service has not reported within its TTL (" + ttl.String() + ")")
	}
	return nil
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
