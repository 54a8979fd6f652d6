package gcpace_test

import (
	"context"
	"runtime/debug"
	"runtime/metrics"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/gcpace"
	"go.uber.org/goleak"
)

const mib = 1 << 20

var pacer = gcpace.Pacer{Min: 100, Max: 400, Headroom: 32 * mib}

// TestPercent pins each branch: nothing live yet and a small heap get Max,
// a heap between gets the headroom as a percentage, a large one Min.
func TestPercent(t *testing.T) {
	for _, c := range []struct {
		live uint64
		want int
	}{
		{0, 400},
		{1, 400},
		{4 * mib, 400},
		{8 * mib, 400},
		{16 * mib, 200},
		{20 * mib, 160},
		{32 * mib, 100},
		{150 * mib, 100},
		{1 << 40, 100},
	} {
		if got := pacer.Percent(c.live); got != c.want {
			t.Errorf("Percent(%d MiB) = %d, want %d", c.live/mib, got, c.want)
		}
	}
}

// TestApplySetsGOGC: Apply sets the GOGC it returns, from the process's
// live heap.
func TestApplySetsGOGC(t *testing.T) {
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	p := gcpace.Pacer{Min: 137, Max: 137, Headroom: mib}
	if got := p.Apply(); got != 137 {
		t.Fatalf("Apply = %d, want 137", got)
	}
	if got := gogc(); got != 137 {
		t.Fatalf("GOGC after Apply = %d, want 137", got)
	}
}

// TestRunAppliesAtOnceAndEnds: Run sets GOGC before its first interval
// and returns, leaving no goroutine, once its context ends.
func TestRunAppliesAtOnceAndEnds(t *testing.T) {
	defer goleak.VerifyNone(t)
	defer debug.SetGCPercent(debug.SetGCPercent(100))
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		gcpace.Pacer{Min: 211, Max: 211, Headroom: mib}.Run(ctx, time.Hour)
	}()
	cancel()
	<-done
	if got := gogc(); got != 211 {
		t.Fatalf("GOGC after Run = %d, want 211 (applied before the first interval)", got)
	}
}

func gogc() int {
	s := []metrics.Sample{{Name: "/gc/gogc:percent"}}
	metrics.Read(s)
	return int(s[0].Value.Uint64())
}
