package kube

import (
	"context"
	"errors"
	"fmt"
	"maps"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// Health verdicts. A health checker over this registry (beacon serve's
// health.Checker) keeps its verdicts in this process's own InstanceSet,
// beside its own registration (beacon/health/checker/<hash>), under
// spec.verdicts: written by the same writer, whole, coalesced with the
// registrations, garbage-collected with the pod. Readers count a set's
// verdicts exactly while its instances are live — while its pod is Ready
// in a discovery EndpointSlice — so a checker whose pod is not Ready or
// gone has its verdicts ignored at once (fail-open), as the store
// registries drop a dead checker's verdicts with its lease. Where sets of
// several live checkers hold a verdict on one instance (a handover: the
// old owner's stays until the new owner's shows, then the old owner
// deletes it), the most recent one counts.

var _ registry.VerdictKeeper = (*Registry)(nil)

// VerdictSink implements registry.VerdictKeeper: the checker's verdicts
// are kept in this process's InstanceSet. It needs the pod identity, as
// Register does (ErrNoPodIdentity). The checker's ID is in every verdict
// it writes (beacon.Health.Checker).
func (r *Registry) VerdictSink(checkerID string) (registry.VerdictSink, error) {
	if r.kind != instanceSets {
		return nil, fmt.Errorf("%w: the %s layout is read-only: no health checker writes to it", ErrReadOnly, r.kind.kind)
	}
	if err := r.cfg.Pod.check(); err != nil {
		return nil, err
	}
	return &verdictSink{r: r}, nil
}

// verdictSink is a checker's registry.VerdictSink.
type verdictSink struct{ r *Registry }

// PutVerdict records h in the InstanceSet; the writer writes it with what
// else changed meanwhile, retrying until it is written, so it returns
// before the write (an error only when the set would be too large, or the
// writer stopped for good).
func (s *verdictSink) PutVerdict(ctx context.Context, ref beacon.Ref, h beacon.Health) error {
	h.Panic = false
	return s.change(ctx, func(vs map[string]beacon.Health) { vs[refKey(ref)] = h })
}

// DeleteVerdict removes the verdict on ref from the InstanceSet, as
// PutVerdict writes one.
func (s *verdictSink) DeleteVerdict(ctx context.Context, ref beacon.Ref) error {
	return s.change(ctx, func(vs map[string]beacon.Health) { delete(vs, refKey(ref)) })
}

// change applies edit to the writer's verdicts and has them written.
func (s *verdictSink) change(ctx context.Context, edit func(map[string]beacon.Health)) error {
	if s.r.closed.Load() {
		return registry.ErrClosed
	}
	w, err := s.r.writerFor(ctx)
	if err != nil {
		return err
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.fatal != nil {
		return w.fatal
	}
	prev := w.verdicts
	w.verdicts = maps.Clone(prev) // prev is kept to undo a change that makes the set too large
	if w.verdicts == nil {
		w.verdicts = map[string]beacon.Health{}
	}
	edit(w.verdicts)
	if _, err := w.bodyLocked(); err != nil {
		w.verdicts = prev
		return fmt.Errorf("kube: health verdict: %w", err)
	}
	w.bumpLocked()
	return nil
}

// Close removes every verdict of the checker and waits, within
// Config.Timeout, for the write.
func (s *verdictSink) Close() error {
	s.r.writerMu.Lock()
	w := s.r.writer
	s.r.writerMu.Unlock()
	if w == nil {
		return nil
	}
	w.mu.Lock()
	if len(w.verdicts) == 0 || w.fatal != nil {
		w.mu.Unlock()
		return nil
	}
	w.verdicts = nil
	g := w.bumpLocked()
	w.mu.Unlock()
	ctx, cancel := s.r.opContext()
	defer cancel()
	if err := w.wait(ctx, g); err != nil && !errors.Is(err, registry.ErrClosed) {
		return fmt.Errorf("kube: remove the health verdicts: %w", err)
	}
	return nil
}
