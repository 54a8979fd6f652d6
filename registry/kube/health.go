package kube

import (
	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry/internal/healthjoin"
	shared "github.com/beaconplane/beacon/registry/internal/view"
)

// Health in the view. The verdicts of a set (spec.verdicts: those of the
// checker its process runs, verdicts.go) count while the set's pod is
// Ready, as its instances do; where the sets of several Ready pods hold a
// verdict on one instance, the most recent counts (newerVerdict). The view
// joins them to its instances with the join the store registries use
// (healthjoin: unknown until a verdict, a failing one left out of
// routing, the panic threshold per priority level of a service,
// Config.HealthPanicThreshold), so that a verdict that changes, or a
// checker's pod that stops being Ready, is one update of the instances
// concerned for every watcher.

// liveVerdict is a verdict a set of a Ready pod holds.
type liveVerdict struct {
	h   beacon.Health
	set *setInfo // nil: none
}

// newerVerdict returns the verdict that counts of a and b: the more
// recent (Since), then that of the smaller set key, so that every reader
// picks the same.
func newerVerdict(a, b liveVerdict) liveVerdict {
	switch {
	case a.set == nil:
		return b
	case b.set == nil:
		return a
	case !a.h.Since.Equal(b.h.Since):
		if b.h.Since.After(a.h.Since) {
			return b
		}
		return a
	case b.set.key < a.set.key:
		return b
	}
	return a
}

// joinHealth joins the verdicts the live sets hold to the live instances
// of a listing (List), as the view does.
func (r *Registry) joinHealth(live map[string]candidate, sets []*setInfo, ready func(pod string) bool) map[string]beacon.Instance {
	verdicts := map[string]liveVerdict{}
	for _, s := range sets {
		if !ready(s.pod) {
			continue
		}
		for k, h := range s.verdicts {
			verdicts[k] = newerVerdict(verdicts[k], liveVerdict{h: h, set: s})
		}
	}
	stored := make(map[string]beacon.Health, len(verdicts))
	for k, v := range verdicts {
		stored[k] = v.h
	}
	j := healthjoin.New(r.cfg.HealthPanicThreshold)
	j.ReplaceVerdicts(stored)
	items := make([]*shared.Item, 0, len(live))
	for k, c := range live {
		items = append(items, &shared.Item{Key: k, Inst: c.inst.Clone()})
	}
	j.JoinAll(items)
	out := make(map[string]beacon.Instance, len(items))
	for _, it := range items {
		out[it.Key] = it.Inst
	}
	return out
}
