package naming

import (
	"context"
	"errors"
	"fmt"
	"log/slog"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/wait"
	"github.com/beaconplane/beacon/naming/internal/publish"
	"github.com/beaconplane/beacon/registry"
	"google.golang.org/grpc/resolver"
)

// nameResolver follows one target for one gRPC channel. One goroutine (run)
// owns the registry watch and every call to the ClientConn.
type nameResolver struct {
	b      *Builder
	q      beacon.Query
	target string
	pub    *publish.Publisher
	log    *slog.Logger

	ctx    context.Context
	cancel context.CancelFunc
	done   chan struct{}
}

var _ resolver.Resolver = (*nameResolver)(nil)

func startResolver(b *Builder, q beacon.Query, target string, cc resolver.ClientConn) *nameResolver {
	log := b.log.With("target", target)
	r := &nameResolver{
		b:      b,
		q:      q,
		target: target,
		pub:    publish.New(cc, b.scheme, target, b.m, log),
		log:    log,
		done:   make(chan struct{}),
	}
	r.ctx, r.cancel = context.WithCancel(context.Background())
	b.m.AddResolvers(b.scheme, 1)
	go r.run()
	return r
}

// ResolveNow implements resolver.Resolver. The resolver follows a watch, so
// there is nothing to resolve again: changes arrive as they happen, and
// after trouble the resolver re-watches on its own.
func (r *nameResolver) ResolveNow(resolver.ResolveNowOptions) {}

// Close implements resolver.Resolver: it ends the watch and waits for the
// resolver's goroutine, which never blocks once its context is cancelled.
func (r *nameResolver) Close() {
	r.cancel()
	<-r.done
}

// run watches until Close, watching again with backoff whenever a watch
// ends with an error.
func (r *nameResolver) run() {
	defer close(r.done)
	defer r.b.m.AddResolvers(r.b.scheme, -1)
	bo := publish.Backoff{Min: retryFirst, Max: r.b.retryMax}
	for {
		err := r.follow(&bo)
		if r.ctx.Err() != nil {
			return
		}
		if errors.Is(err, registry.ErrClosed) {
			// The registry will not come back: say so, and keep saying
			// it (the channel holds the error) until the channel closes.
			r.log.Error("registry closed; the channel can no longer follow its instances", "err", err)
			r.pub.Error(publish.ReasonClosed, fmt.Errorf("%w: %s: %w", ErrWatchEnded, r.target, err))
			<-r.ctx.Done()
			return
		}
		d := bo.Next()
		r.pub.Error(publish.ReasonWatchFailed, fmt.Errorf("%w: %s: %w", ErrWatchEnded, r.target, err))
		r.log.Warn("registry watch ended; watching again", "err", err, "retry_in", d)
		if !wait.Sleep(r.ctx, d) {
			return
		}
	}
}

// follow runs one registry watch until it fails, publishing the full state
// after every batch. Its first batch is a snapshot, so a new watch always
// replaces whatever the channel had.
func (r *nameResolver) follow(bo *publish.Backoff) error {
	w, err := r.b.d.Watch(r.ctx, r.q)
	if err != nil {
		return err
	}
	defer func() { _ = w.Close() }()
	view := publish.NewView(beacon.Instance.Equal, func(_ string, in beacon.Instance) (publish.Entry, bool) {
		return publish.Entry{Addr: in.Address, Attrs: attributesOf(in)}, in.Serving()
	})
	for {
		batch, err := w.Next(r.ctx)
		if err != nil {
			return err
		}
		r.log.Debug("registry batch", "kind", batch.Kind, "events", len(batch.Events), "revision", batch.Revision)
		switch batch.Kind {
		case registry.Stale:
			// Keep the last state (balancers keep using the instances they
			// know) but tell gRPC: RPCs that fail now say why, and the
			// next batch, a Resync, pushes the full state again.
			r.pub.Error(publish.ReasonStale, fmt.Errorf("%w: %s: %w", ErrStale, r.target, batch.Err))
			r.log.Warn("registry watch is stale; keeping the last known instances", "err", batch.Err)
			continue
		case registry.Snapshot:
			view.Reset()
		}
		for _, ev := range batch.Events {
			ref := ev.Instance.Ref()
			if !r.q.Matches(ref) {
				continue
			}
			if ev.Type == beacon.Removed {
				view.Delete(ref.String())
			} else {
				view.Set(ref.String(), ev.Instance)
			}
		}
		bo.Reset()
		r.publish(view)
	}
}

// publish pushes the serving instances of view, sorted by name.
func (r *nameResolver) publish(view *publish.View[beacon.Instance]) {
	entries, undialable := view.Entries()
	var empty error
	if len(entries) == undialable {
		empty = r.noInstances(view, undialable)
	}
	r.pub.Publish(entries, empty)
}

// noInstances says why view has no instance gRPC can dial: how many are
// registered, and of those how many drain, fail their health check, or
// have an address gRPC cannot dial.
func (r *nameResolver) noInstances(view *publish.View[beacon.Instance], undialable int) error {
	total := view.Len()
	if total == 0 {
		return fmt.Errorf("%w of %s: none registered", ErrNoInstances, r.target)
	}
	draining := view.Count(beacon.Instance.Draining)
	failing := view.Count(func(in beacon.Instance) bool { return !in.Draining() && in.Health.Failing() })
	return fmt.Errorf("%w of %s: %d registered, %d draining, %d failing their health check, %d with an address gRPC cannot dial (want host:port)",
		ErrNoInstances, r.target, total, draining, failing, undialable)
}
