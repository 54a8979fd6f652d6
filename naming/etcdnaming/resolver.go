package etcdnaming

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/url"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/naming/internal/publish"
	"github.com/beaconplane/beacon/store"
	"google.golang.org/grpc"
	"google.golang.org/grpc/resolver"
)

// retryFirst is the first backoff delay after a failure.
const retryFirst = 50 * time.Millisecond

// Builder is a grpc-go resolver.Builder for etcd:///<target>, reading the
// endpoints that etcd's endpoint manager (or Manager) writes under
// "<target>/". It replaces etcd's go.etcd.io/etcd/client/v3/naming/resolver
// and fixes what goes wrong there: after a watch error or a compaction it
// lists again and pushes the full state (etcd's goes silent for good);
// while the store is unreachable it reports the stale view to gRPC; with no
// endpoints it reports an error so RPCs fail fast; endpoint metadata
// reaches balancers as attributes that are safe to compare (etcd#19700).
// Pass it with grpc.WithResolvers; it is not registered globally.
type Builder struct {
	st       store.Store
	scheme   string
	probe    time.Duration
	retryMax time.Duration
	log      *slog.Logger
	m        *publish.Metrics
}

var _ resolver.Builder = (*Builder)(nil)

// NewBuilder returns a Builder over st (for an existing etcd client:
// etcd.NewFromClient(cli)). It contacts nothing. Options: WithLogger,
// WithMetrics, WithScheme, WithProbeInterval, WithRetryMax.
func NewBuilder(st store.Store, opts ...Option) (*Builder, error) {
	if st == nil {
		return nil, fmt.Errorf("%w: nil store", ErrInvalidConfig)
	}
	o, m, err := buildOptions(opts)
	if err != nil {
		return nil, err
	}
	if err := publish.CheckScheme(o.scheme); err != nil {
		return nil, fmt.Errorf("%w: %w", ErrInvalidConfig, err)
	}
	return &Builder{
		st:       st,
		scheme:   o.scheme,
		probe:    o.probe,
		retryMax: max(o.retryMax, retryFirst),
		log:      o.log.With("component", "etcdnaming", "scheme", o.scheme),
		m:        m,
	}, nil
}

// DialOption returns grpc.WithResolvers(b).
func (b *Builder) DialOption() grpc.DialOption { return grpc.WithResolvers(b) }

// Scheme implements resolver.Builder.
func (b *Builder) Scheme() string { return b.scheme }

// Build implements resolver.Builder. It never waits for the network. The
// target is etcd:///<target> (or etcd:<target>), as for etcd's resolver;
// an authority, query or fragment, or a target ending in '/', gives an
// error matching ErrInvalidTarget.
func (b *Builder) Build(t resolver.Target, cc resolver.ClientConn, _ resolver.BuildOptions) (resolver.Resolver, error) {
	raw := t.URL.String()
	target, err := parseURL(b.scheme, &t.URL, raw)
	if err != nil {
		return nil, err
	}
	log := b.log.With("target", raw)
	r := &etcdResolver{
		b:       b,
		target:  target,
		prefix:  target + "/",
		raw:     raw,
		pub:     publish.New(cc, b.scheme, raw, b.m, log),
		log:     log,
		health:  make(chan struct{}, 1),
		invalid: make(map[string]bool),
		logged:  make(map[string]int64),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	b.m.AddResolvers(b.scheme, 1)
	r.wg.Add(2)
	go r.run()
	go r.probe()
	return r, nil
}

// ParseTarget returns the key prefix (without its trailing '/') that an
// etcd:///<target> gRPC target names.
func ParseTarget(target string) (string, error) {
	u, err := url.Parse(target)
	if err != nil {
		return "", fmt.Errorf("%w %q: not a URL (%v); write etcd:///<target>", ErrInvalidTarget, target, err)
	}
	return parseURL(Scheme, u, target)
}

// parseURL reads the target as etcd's resolver does (the path, or the
// opaque part, without one leading '/'), and rejects what etcd's ignores.
func parseURL(scheme string, u *url.URL, raw string) (string, error) {
	form := scheme + ":///<target>"
	switch {
	case u.Scheme != scheme:
		return "", fmt.Errorf("%w %q: scheme must be %q; write %s", ErrInvalidTarget, raw, scheme, form)
	case u.User != nil || u.Host != "":
		return "", fmt.Errorf("%w %q: has authority %q, which etcd targets do not use; write %s:///%s%s (three slashes)",
			ErrInvalidTarget, raw, u.Host, scheme, u.Host, u.EscapedPath())
	case u.RawQuery != "" || u.ForceQuery || u.Fragment != "":
		return "", fmt.Errorf("%w %q: query parameters and fragments are not supported; write %s", ErrInvalidTarget, raw, form)
	}
	target := u.Path
	if target == "" {
		target = u.Opaque
	}
	target = strings.TrimPrefix(target, "/")
	if err := validateTarget(target); err != nil {
		return "", fmt.Errorf("%w (from %q; write %s)", err, raw, form)
	}
	return target, nil
}

// etcdResolver follows one target for one channel. run owns the view and
// every call to the ClientConn; probe checks the store.
type etcdResolver struct {
	b      *Builder
	target string
	prefix string
	raw    string
	pub    *publish.Publisher
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	wg     sync.WaitGroup

	// Set by probe, read by run (run also clears down: see follow).
	down    atomic.Bool
	downErr atomic.Pointer[error]
	health  chan struct{} // nudged when down changes
	// Counted by run, read by probe: watch responses received (events or
	// progress), the proof that the watch is live whatever a read met.
	heard atomic.Uint64

	// Owned by run.
	reportedDown bool
	invalid      map[string]bool  // keys whose value is not an endpoint
	logged       map[string]int64 // key → mod revision of the invalid value last logged
}

// ResolveNow implements resolver.Resolver; changes arrive by watch, so
// there is nothing to do.
func (r *etcdResolver) ResolveNow(resolver.ResolveNowOptions) {}

// Close implements resolver.Resolver.
func (r *etcdResolver) Close() {
	r.cancel()
	r.wg.Wait()
}

var (
	errReconnected = errors.New("store answers again")
	errWatchClosed = errors.New("store watch closed")
)

// run lists, publishes, watches from the listing's revision + 1, and lists
// again whenever the watch ends, until Close.
func (r *etcdResolver) run() {
	defer r.wg.Done()
	defer r.b.m.AddResolvers(r.b.scheme, -1)
	bo := publish.Backoff{Min: retryFirst, Max: r.b.retryMax}
	view := publish.NewView(decoded.equal, func(key string, d decoded) (publish.Entry, bool) {
		return publish.Entry{Addr: d.ep.Addr, Attrs: attributesOf(key, d)}, true
	})
	for r.ctx.Err() == nil {
		kvs, rev, err := r.b.st.List(r.ctx, r.prefix)
		if err != nil {
			if r.ctx.Err() != nil {
				return
			}
			if errors.Is(err, store.ErrClosed) {
				r.closed(err)
				return
			}
			d := bo.Next()
			r.pub.Error(publish.ReasonWatchFailed, fmt.Errorf("%w: %s: list: %w", ErrStale, r.raw, err))
			r.log.Warn("cannot list endpoints; retrying", "err", err, "retry_in", d)
			if !wait.Sleep(r.ctx, d) {
				return
			}
			continue
		}
		view.Reset()
		clear(r.invalid)
		for _, kv := range kvs {
			r.apply(view, store.Event{Type: store.EventPut, KV: kv})
		}
		for key := range r.logged {
			if !r.invalid[key] {
				delete(r.logged, key) // deleted or fixed while the watch was down
			}
		}
		r.reportedDown = false
		r.publish(view)

		err = r.follow(rev+1, view)
		switch {
		case r.ctx.Err() != nil:
			return
		case errors.Is(err, errReconnected):
			r.b.m.Resync(r.b.scheme, publish.ReasonReconnect)
			r.log.Info("store answers again; re-listing")
			bo.Reset()
		case errors.Is(err, store.ErrCompacted):
			// Not an outage: list again at once.
			r.b.m.Resync(r.b.scheme, publish.ReasonCompacted)
			r.log.Info("watch fell behind compaction; re-listing", "err", err)
			bo.Reset()
		case errors.Is(err, store.ErrClosed), errors.Is(err, errWatchClosed):
			r.closed(err)
			return
		default:
			r.b.m.Resync(r.b.scheme, publish.ReasonWatchFailed)
			d := bo.Next()
			r.pub.Error(publish.ReasonWatchFailed, fmt.Errorf("%w: %s: watch: %w", ErrStale, r.raw, err))
			r.log.Warn("watch failed; re-listing", "err", err, "retry_in", d)
			if !wait.Sleep(r.ctx, d) {
				return
			}
		}
	}
}

// closed reports that the store is closed for good and waits for Close.
func (r *etcdResolver) closed(err error) {
	r.log.Error("store closed; the channel can no longer follow its endpoints", "err", err)
	r.pub.Error(publish.ReasonClosed, fmt.Errorf("%w: %s: %w", ErrStale, r.raw, err))
	<-r.ctx.Done()
}

// follow applies the watch from rev to view, publishing after every
// response (one store revision: a multi-endpoint update arrives whole),
// until the watch ends or the store answers again after an outage. A
// response after the stale view was reported (events, or progress from a
// store that promises it) ends the report without a re-listing: the
// watch resumed without a gap (store.Watcher's contract), so the view
// missed nothing. When the probe finds the store answering first, a
// watch that promises progress gets twice its interval to deliver before
// the prefix is listed again (at once without a promise), as the
// registry's feeds do: on a cluster too busy to answer, a re-listing per
// channel made it busier.
func (r *etcdResolver) follow(rev int64, view *publish.View[decoded]) error {
	ctx, cancel := context.WithCancel(r.ctx)
	defer cancel()
	var ch store.WatchChan
	pw := store.PromisedProgress(r.b.st)
	if pw != nil {
		ch = pw.WatchProgress(ctx, r.prefix, rev)
	} else {
		ch = r.b.st.Watch(ctx, r.prefix, rev)
	}
	var grace *time.Timer // armed while the store answers and the watch has yet to
	var relist <-chan time.Time
	defer func() {
		if grace != nil {
			grace.Stop()
		}
	}()
	disarm := func() {
		if relist != nil {
			grace.Stop()
			relist = nil
		}
	}
	for {
		select {
		case resp, ok := <-ch:
			if !ok {
				if r.ctx.Err() != nil {
					return r.ctx.Err()
				}
				// Only a closed store ends a watch without an error.
				return errWatchClosed
			}
			if resp.Err != nil {
				return resp.Err
			}
			r.heard.Add(1)
			for _, ev := range resp.Events {
				r.apply(view, ev)
			}
			if r.reportedDown {
				r.reportedDown = false
				r.down.Store(false) // the probe's next failure reports it again
				disarm()
				r.log.Info("store watch delivers again; the endpoint list is current")
			}
			r.publish(view) // pushed even if unchanged after a reported error
		case <-r.health:
			down := r.down.Load()
			switch {
			case down && !r.reportedDown:
				r.reportedDown = true
				err := errors.New("unknown error")
				if p := r.downErr.Load(); p != nil {
					err = *p
				}
				r.pub.Error(publish.ReasonStale, fmt.Errorf("%w: %s: store unreachable: %w", ErrStale, r.raw, err))
				r.log.Warn("store unreachable; keeping the last known endpoints", "err", err)
			case down:
				disarm() // unreachable again: the watch resumes when it answers
			case r.reportedDown && pw == nil:
				return errReconnected
			case r.reportedDown && relist == nil:
				d := 2 * pw.ProgressInterval()
				if grace == nil {
					grace = time.NewTimer(d)
				} else {
					grace.Reset(d)
				}
				relist = grace.C
			}
		case <-relist:
			r.log.Info("store answers again but its watch reported nothing in twice its progress interval; re-listing",
				"progress_interval", pw.ProgressInterval())
			return errReconnected
		case <-r.ctx.Done():
			return r.ctx.Err()
		}
	}
}

// apply applies one store event to view. A value that is not an endpoint
// removes the key (its writer no longer advertises the old value) and is
// logged and counted once per value (not again when a re-list finds it).
func (r *etcdResolver) apply(view *publish.View[decoded], ev store.Event) {
	key := ev.KV.Key
	if ev.Type == store.EventDelete {
		view.Delete(key)
		delete(r.invalid, key)
		delete(r.logged, key)
		return
	}
	d, err := decode(ev.KV.Value)
	if err != nil {
		view.Delete(key)
		r.invalid[key] = true
		if r.logged[key] != ev.KV.ModRevision {
			r.logged[key] = ev.KV.ModRevision
			r.b.m.Skipped(r.b.scheme, skipReason(err))
			r.log.Warn("skipping a value that is not an endpoint", "key", key, "revision", ev.KV.ModRevision, "err", err)
		}
		return
	}
	delete(r.invalid, key)
	delete(r.logged, key)
	view.Set(key, d)
}

// publish pushes view, sorted by key.
func (r *etcdResolver) publish(view *publish.View[decoded]) {
	entries, undialable := view.Entries()
	var empty error
	if len(entries) == undialable {
		switch {
		case view.Len() > 0:
			empty = fmt.Errorf("%w under %q (%s): %d endpoint(s), none with an address gRPC can dial (want host:port)",
				ErrNoEndpoints, r.prefix, r.raw, view.Len())
		case len(r.invalid) > 0:
			empty = fmt.Errorf("%w under %q (%s): %d key(s) hold values that are not endpoints",
				ErrNoEndpoints, r.prefix, r.raw, len(r.invalid))
		default:
			empty = fmt.Errorf("%w under %q (%s): none registered", ErrNoEndpoints, r.prefix, r.raw)
		}
	}
	r.pub.Publish(entries, empty)
}

// probe checks that the store answers, every probe interval, and nudges
// run when that changes: a store watch stays silent while the store is
// unreachable, so without the probe an outage would look like "nothing
// changed".
func (r *etcdResolver) probe() {
	defer r.wg.Done()
	wait.Every(r.ctx, r.b.probe, func() {
		heard := r.heard.Load()
		ctx, cancel := context.WithTimeout(r.ctx, r.b.probe)
		_, err := r.b.st.Get(ctx, r.prefix)
		cancel()
		if r.ctx.Err() != nil || errors.Is(err, store.ErrClosed) {
			return // run finds out on its own
		}
		// A watch that delivered while the read waited is live: a store
		// too busy to answer one read in time still streams events.
		down := err != nil && !errors.Is(err, store.ErrNotFound) && r.heard.Load() == heard
		if down {
			r.downErr.Store(&err)
		}
		if r.down.Swap(down) != down {
			select {
			case r.health <- struct{}{}:
			default:
			}
		}
	})
}
