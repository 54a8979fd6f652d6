package etcdwatch

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/metadata"
)

// ErrSilent is the error of a watch that heard nothing (no event, no
// progress notification, no answer to a progress request) for its
// silence timeout.
var ErrSilent = errors.New("etcdwatch: nothing from etcd (no event, no progress notification)")

// ErrClientClosed is the error of a watch whose etcd client was closed
// (only that ends a clientv3 watch without a response).
var ErrClientClosed = errors.New("etcdwatch: the etcd client was closed")

// SilentError is ErrSilent with how long the watch was quiet.
type SilentError struct{ Quiet time.Duration }

func (e *SilentError) Error() string {
	return fmt.Sprintf("%v for %v", ErrSilent, e.Quiet.Round(time.Millisecond))
}

func (e *SilentError) Unwrap() error { return ErrSilent }

// Config is one watch's settings.
type Config struct {
	// Client runs the etcd watches and progress requests.
	Client *clientv3.Client
	// Key and Options select the watched range (clientv3.WithPrefix ...);
	// Run adds the start revision, created and progress notifications.
	Key     string
	Options []clientv3.OpOption
	// Silence is the silence timeout (0 or less: none). Each etcd watch
	// then runs on a gRPC stream of its own (StreamKey), so that a
	// progress request tests this watch's stream, and a new watch after a
	// silent one gets a new stream, on a member the balancer picks again.
	Silence time.Duration
	// StreamKey is the gRPC metadata key that gives each etcd watch its
	// own stream (etcd ignores it). Empty: "beacon-watch".
	StreamKey string
	// BeforeSilent, if set, runs before Run would return a *SilentError
	// (the store lets its prober leave the silent member out first); it
	// must return once ctx ends. It returns whether the watch should carry
	// on instead: no other member would serve it better (every member
	// answers, so etcd is lagging behind its writes, or none does). The
	// watch then carries on, its silence measured again from now, up to
	// MaxLagged times in a row; ending it would re-list its prefix on an
	// etcd that already cannot keep up (a process with thousands of
	// watched prefixes re-listed 12,855 times in a minute on a busy
	// 3-member cluster before).
	BeforeSilent func(ctx context.Context) (lagging bool)
	// Created, if set, is called once etcd has created the first watch.
	Created func()
	// Deliver hands the consumer the events of one response (never
	// empty, in revision order, each once); header is the response's
	// revision. A non-nil error ends Run with that error. Time spent in
	// Deliver is not silence.
	Deliver func(ctx context.Context, header int64, evs []*clientv3.Event) error
	// Progress, if set, hands the consumer each progress notification:
	// every event up to rev was delivered (the position's Next - 1). A non-nil error ends Run with that
	// error. With Silence set, a quiet watch gets one at least every
	// Silence*3/4 while its member answers (it asks after half the
	// timeout, then every quarter).
	Progress func(ctx context.Context, rev int64) error
}

// streamSeq numbers the etcd watches' streams, process-wide.
var streamSeq atomic.Uint64

// Run runs a watch from rev (0: the revision current when etcd creates
// it) until ctx ends (nil), Deliver fails (its error), or the watch fails:
// a *CompactedError, a *SilentError, ErrClientClosed, or etcd's error (a
// lost leader with clientv3.WithRequireLeader, permission denied).
func Run(ctx context.Context, cfg Config, rev int64) error {
	r := &runner{cfg: cfg, st: New(rev, cfg.Silence, time.Now())}
	ctx, cancel := context.WithCancel(ctx)
	r.ctx = ctx
	defer func() {
		cancel()
		r.opens.Wait() // clientv3's Watch returns once its context is done
	}()
	r.cur = r.open(rev)
	var check <-chan time.Time
	if cfg.Silence > 0 {
		t := time.NewTicker(cfg.Silence / 8)
		defer t.Stop()
		check = t.C
	}
	for {
		var (
			wr   clientv3.WatchResponse
			ok   bool
			repl bool
		)
		select {
		case r.cur.ch = <-r.cur.opened:
			r.cur.opened = nil
			r.st.Opened()
			continue
		case r.next.ch = <-r.next.opened:
			r.next.opened = nil
			continue
		case wr, ok = <-r.cur.ch:
		case wr, ok = <-r.next.ch:
			repl = true
		case now := <-check:
			if err := r.tick(now); err != nil {
				return err
			}
			continue
		case <-ctx.Done():
			return nil
		}
		if ctx.Err() != nil {
			return nil // cancelled: no error
		}
		r.st.OnHeard(time.Now())
		if err := r.handle(wr, ok, repl); err != nil {
			if ctx.Err() != nil {
				return nil
			}
			return err
		}
	}
}

// etcdWatch is one etcd watch: opened is where clientv3's Watch, run
// aside (it blocks until it has a gRPC stream, which never happens on a
// hung member), hands over its channel.
type etcdWatch struct {
	sctx   context.Context // the stream's metadata
	stop   context.CancelFunc
	opened chan clientv3.WatchChan
	ch     clientv3.WatchChan // nil until opened
}

type runner struct {
	cfg       Config
	ctx       context.Context
	st        *State
	opens     sync.WaitGroup // the goroutines calling Watch
	cur, next etcdWatch      // next: the replacement (zero: none)
	created   bool
}

// open starts an etcd watch from rev on a stream of its own.
func (r *runner) open(rev int64) etcdWatch {
	key := r.cfg.StreamKey
	if key == "" {
		key = "beacon-watch"
	}
	sctx := metadata.AppendToOutgoingContext(r.ctx, key, strconv.FormatUint(streamSeq.Add(1), 10))
	opts := append([]clientv3.OpOption{clientv3.WithCreatedNotify(), clientv3.WithProgressNotify()}, r.cfg.Options...)
	if rev > 0 {
		opts = append(opts, clientv3.WithRev(rev))
	}
	// Its own context with the stream's metadata: cancelling it ends only
	// this etcd watch.
	octx, stop := context.WithCancel(sctx)
	w := etcdWatch{sctx: sctx, stop: stop, opened: make(chan clientv3.WatchChan, 1)}
	r.opens.Go(func() { w.opened <- r.cfg.Client.Watch(octx, r.cfg.Key, opts...) })
	return w
}

// tick runs the silence check.
func (r *runner) tick(now time.Time) error {
	t := r.st.OnTick(now)
	if t.AskReplacement {
		r.ask(r.next.sctx)
	}
	switch {
	case t.Silent > 0:
		if r.cfg.BeforeSilent != nil && r.cfg.BeforeSilent(r.ctx) && r.st.Lagged(time.Now()) {
			return nil
		}
		return &SilentError{Quiet: t.Silent}
	case t.Ask:
		r.ask(r.cur.sctx)
	case t.ReplaceFrom > 0:
		r.next = r.open(t.ReplaceFrom)
	}
	return nil
}

// ask sends a progress request on sctx's stream; a failure shows as
// continued silence.
func (r *runner) ask(sctx context.Context) {
	ctx, cancel := context.WithTimeout(sctx, r.cfg.Silence/4)
	defer cancel()
	_ = r.cfg.Client.RequestProgress(ctx)
}

// drop ends the replacement.
func (r *runner) drop() {
	r.next.stop()
	r.next = etcdWatch{}
}

// handle takes one response; repl: the replacement's.
func (r *runner) handle(wr clientv3.WatchResponse, ok, repl bool) error {
	st := r.st
	if repl && ok && (wr.CompactRevision != 0 || wr.Err() == nil) {
		switch {
		case wr.CompactRevision != 0:
			r.drop()
			if from := st.OnReplacementCompacted(wr.Header.Revision); from > 0 {
				r.next = r.open(from)
			}
			return nil
		case wr.Created:
			st.OnReplacementCreated(wr.Header.Revision)
			r.ask(r.next.sctx)
			return nil
		}
		st.OnReplacementSynced()
		r.cur.stop()
		r.cur, r.next = r.next, etcdWatch{}
	}
	switch {
	case !ok:
		return ErrClientClosed
	case wr.CompactRevision != 0:
		from, err := st.OnCompacted(wr.CompactRevision, wr.Header.Revision)
		if err != nil {
			return err
		}
		r.cur.stop()
		r.cur = r.open(from)
		return nil
	case wr.Err() != nil:
		return wr.Err()
	case wr.Created:
		st.Created(wr.Header.Revision)
		if !r.created && r.cfg.Created != nil {
			r.cfg.Created()
		}
		r.created = true
		return nil
	case wr.IsProgressNotify():
		st.Progress(wr.Header.Revision)
		if r.cfg.Progress == nil || st.Next <= 1 {
			return nil
		}
		if err := r.cfg.Progress(r.ctx, st.Next-1); err != nil {
			return err
		}
		st.OnHeard(time.Now())
		return nil
	}
	evs := st.Fresh(wr.Header.Revision, wr.Events)
	if len(evs) == 0 {
		return nil
	}
	if err := r.cfg.Deliver(r.ctx, wr.Header.Revision, evs); err != nil {
		return err
	}
	st.OnHeard(time.Now()) // time spent waiting for the consumer is not silence
	return nil
}
