// Package gcpace sets the garbage collector's GOGC from the live heap, so
// that a process whose live heap is small but which allocates for every
// message it moves (a proxy fanning events out) collects less often,
// while one whose live heap is large does not grow by several times it.
//
// Go's GOGC is a percentage of the live heap: at the default of 100 a
// proxy with 4 MiB live collects every 4 MiB allocated, and a fan-out that
// overlaps the mark makes the delivery tail; at a fixed 400 the same proxy
// with 100,000 watchers and 150 MiB live may grow by 600 MiB. A Pacer
// gives the heap a fixed headroom instead — GOGC = Headroom / live, within
// [Min, Max] — and Run keeps it there as the live heap changes.
package gcpace

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"time"

	"github.com/beaconplane/beacon/internal/wait"
)

// Pacer chooses GOGC from the live heap.
type Pacer struct {
	Min, Max int    // bounds of GOGC, in percent (Min > 0, Max >= Min)
	Headroom uint64 // bytes the heap may grow past the live heap before a collection
}

// Percent returns the GOGC for a live heap of live bytes: Headroom as a
// percentage of live, within [Min, Max] (Max when nothing is live yet).
func (p Pacer) Percent(live uint64) int {
	if live == 0 {
		return p.Max
	}
	pct := p.Headroom * 100 / live
	return int(max(min(pct, uint64(p.Max)), uint64(p.Min)))
}

// Apply sets GOGC from the live heap the last collection marked and
// returns it. GOGC is process-wide: Apply is for the process's main
// command, not for a library.
func (p Pacer) Apply() int {
	s := []metrics.Sample{{Name: "/gc/heap/live:bytes"}}
	metrics.Read(s)
	var live uint64
	if s[0].Value.Kind() == metrics.KindUint64 {
		live = s[0].Value.Uint64()
	}
	pct := p.Percent(live)
	debug.SetGCPercent(pct)
	return pct
}

// Run applies the pacer at once and then every interval until ctx ends.
func (p Pacer) Run(ctx context.Context, every time.Duration) {
	p.Apply()
	wait.Every(ctx, every, func() { p.Apply() })
}
