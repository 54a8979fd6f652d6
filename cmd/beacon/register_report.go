package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// TTL checks' reports through beacon register.
//
// An instance registered with --check ttl:DURATION passes while its
// service says, at least once per DURATION, that it is fine. Through beacon
// register the service says so on the command's standard input: each line
// is one report (its content is not read). A service wrapped by beacon
// register, or a loop beside it, writes a line whenever its own test of
// itself passes:
//
//	while my-selftest; do echo ok; sleep 10; done | beacon register ... --check ttl:30s
//
// Lines are coalesced: a report is written at the first line, then at most
// once per reportSpacing(TTL), the last line of a window written when it
// ends, so that a chatty service costs the store a bounded rate of writes.
// When standard input ends, no report follows: the check fails one TTL
// after the last one and the instance leaves routing, registered all the
// same (beacon ls shows it failing).

// reportSpacing is the least time between two reports written for lines
// read: a quarter of the TTL, so that while lines come at least four
// reports land per TTL.
func reportSpacing(ttl time.Duration) time.Duration { return ttl / 4 }

// ttlReports writes the reports of one registration's TTL check.
type ttlReports struct {
	rep    registry.TTLReporter
	ref    beacon.Ref
	ttl    time.Duration
	in     io.Reader                                                   // one line, one report
	bound  func(context.Context) (context.Context, context.CancelFunc) // bounds one write
	emit   emitFunc
	log    *slog.Logger
	failed bool // the last write failed: the next success is printed
}

// run writes a report for the lines of t.in until ctx ends or t.in ends.
// The goroutine reading t.in is the process's: a read cannot be
// interrupted, and it ends at the end of t.in or with the process.
func (t *ttlReports) run(ctx context.Context) {
	lines := make(chan struct{}, 1) // a line since the last report; coalesced
	ended := make(chan error, 1)
	go readLines(t.in, lines, ended)
	t.emit(registerLine{Event: "reporting"}, fmt.Sprintf("reading TTL reports from standard input: each line says %s is fine "+
		"(the check fails when none came for %v)", t.ref, t.ttl))
	var last time.Time
	for n := 0; ; n++ {
		select {
		case <-ctx.Done():
			return
		case err := <-ended:
			t.drain(ctx, lines)
			t.end(err)
			return
		case <-lines:
		}
		if wait := time.Until(last.Add(reportSpacing(t.ttl))); wait > 0 {
			select {
			case <-ctx.Done():
				return
			case <-time.After(wait):
			}
			select {
			case <-lines: // read while waiting: this report says it too
			default:
			}
		}
		last = time.Now()
		t.write(ctx, n == 0)
	}
}

// drain writes the report of a line read before in ended, if any.
func (t *ttlReports) drain(ctx context.Context, lines <-chan struct{}) {
	select {
	case <-lines:
		t.write(ctx, false)
	default:
	}
}

// write writes one report, printing the first, a failure, and the first
// success after failures.
func (t *ttlReports) write(ctx context.Context, first bool) {
	wctx, cancel := t.bound(ctx)
	err := t.rep.Report(wctx, t.ref)
	cancel()
	switch {
	case err != nil && ctx.Err() != nil:
		// The command ends: the report does not matter any more.
	case err != nil:
		t.failed = true
		t.emit(registerLine{Event: "report", Error: err.Error()},
			"report failed (the next line is reported again): "+err.Error())
		t.log.Warn("TTL report failed; the next line is reported again", "instance", t.ref.String(), "err", err)
	case first || t.failed:
		t.failed = false
		t.emit(registerLine{Event: "report"}, "reported: "+t.ref.String()+" is fine")
	}
}

// end says that no report follows.
func (t *ttlReports) end(err error) {
	what := "standard input ended"
	if err != nil {
		what = "standard input could not be read (" + err.Error() + ")"
	}
	w := fmt.Sprintf("%s: no more TTL reports; %s fails its check %v after the last one (%v at most: the checker reads "+
		"reports every %v) and leaves routing, registered all the same", what, t.ref, t.ttl, t.ttl+beacon.TTLReadInterval(t.ttl),
		beacon.TTLReadInterval(t.ttl))
	t.emit(registerLine{Event: "warning", Warning: w}, "warning: "+w)
}

// readLines signals lines (coalesced) for each line of in, then sends the
// read error (nil at the end of in) to ended.
func readLines(in io.Reader, lines chan<- struct{}, ended chan<- error) {
	sc := bufio.NewScanner(in)
	sc.Buffer(make([]byte, 0, 4096), 1<<20)
	for sc.Scan() {
		select {
		case lines <- struct{}{}:
		default: // one is pending already
		}
	}
	ended <- sc.Err()
}

// newTTLReports returns the writer of reg's TTL check's reports, read from
// in, or nil if reg declares no TTL check. r must write reports
// (registry.TTLReporter).
func newTTLReports(conn *registryConn, r registry.Registry, reg registry.Registration, in io.Reader,
	emit emitFunc, log *slog.Logger) (*ttlReports, error) {
	got := reg.Instance()
	if got.Check == nil || got.Check.Kind != beacon.CheckTTL {
		return nil, nil
	}
	rep, ok := r.(registry.TTLReporter)
	if !ok {
		return nil, usagef("--check %s: this registry takes no TTL reports: declare grpc, http:/PATH or tcp", got.Check)
	}
	return &ttlReports{rep: rep, ref: got.Ref(), ttl: got.Check.TTL, in: in, bound: conn.requestCtx, emit: emit, log: log}, nil
}

// start starts writing reports until ctx ends; the function it returns
// stops it and waits for it. A nil t starts nothing.
func (t *ttlReports) start(ctx context.Context) (stop func()) {
	if t == nil {
		return func() {}
	}
	rctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		t.run(rctx)
	}()
	return func() { cancel(); wg.Wait() }
}
