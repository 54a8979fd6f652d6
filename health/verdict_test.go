package health

import (
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
)

// at is the time of the i-th result of results one interval (the
// default) apart.
func at(i int) time.Time {
	return time.Unix(0, 0).Add(time.Duration(i) * beacon.DefaultCheckInterval)
}

// run observes results, a sequence of check results one interval apart:
// 'p' passed, 'f' failed.
func run(t *testing.T, rise, fall int, results string) (statuses string, changes int) {
	t.Helper()
	v := newVerdict(beacon.Check{Kind: beacon.CheckTCP, Rise: rise, Fall: fall})
	for i, r := range results {
		var res error
		if r == 'f' {
			res = errors.New("refused")
		}
		if v.observe(res, at(i)) {
			changes++
		}
		statuses += string(v.status[0]) // u, p or f
	}
	return statuses, changes
}

// TestVerdict pins each transition of the rise/fall state machine by name.
func TestVerdict(t *testing.T) {
	for _, tc := range []struct {
		name       string
		rise, fall int
		results    string
		want       string
	}{
		{"UnknownPassesAtOnce", 2, 3, "p", "p"},
		{"UnknownFailsAfterFall", 2, 3, "fff", "uuf"},
		{"UnknownShortFailureStreakForgotten", 2, 3, "ffp", "uup"},
		{"PassingFailsAfterFall", 2, 3, "pfff", "pppf"},
		{"PassingShortFailureStreakForgotten", 2, 3, "pffpff", "pppppp"},
		{"FailingRisesAfterRise", 2, 3, "fffpp", "uuffp"},
		{"FailingShortPassStreakForgotten", 2, 3, "fffpfpf", "uufffff"},
		{"FallOfOne", 1, 1, "pfpf", "pfpf"},
		{"FlappingFasterThanThresholdsChangesNothing", 2, 3, "pfpfpfpfpf", "pppppppppp"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if got, _ := run(t, tc.rise, tc.fall, tc.results); got != tc.want {
				t.Fatalf("rise %d fall %d, results %s: statuses %s, want %s", tc.rise, tc.fall, tc.results, got, tc.want)
			}
		})
	}
}

// TestVerdictReason: a failing verdict carries the last failure; passing
// clears it.
func TestVerdictReason(t *testing.T) {
	v := newVerdict(beacon.Check{Kind: beacon.CheckTCP, Rise: 1, Fall: 2})
	v.observe(errors.New("first"), at(0))
	v.observe(errors.New("second"), at(1))
	if v.status != Failing || v.reason == nil || v.reason.Error() != "second" {
		t.Fatalf("status %s reason %v, want failing with the last failure", v.status, v.reason)
	}
	v.observe(nil, at(2))
	if v.status != Passing || v.reason != nil {
		t.Fatalf("status %s reason %v, want passing without a reason", v.status, v.reason)
	}
}

// TestVerdictChurnBounded: flapping at any period shorter than the
// thresholds changes nothing; at longer periods, at most one change per
// run of results.
func TestVerdictChurnBounded(t *testing.T) {
	_, changes := run(t, 2, 3, "pffpffpffpffpff")
	if changes != 1 { // the first pass only
		t.Fatalf("%d changes, want 1", changes)
	}
	_, changes = run(t, 2, 3, "pfffppfffppfffpp")
	if changes != 7 {
		t.Fatalf("%d changes, want 7 (one per completed run)", changes)
	}
}

// TestVerdictCountsIntervalsNotResults: results closer than the shortest
// wait between two probes (0.9 interval) count once toward a threshold —
// a status a gRPC server pushes and the Check just after it, or two
// Checks brought together by their jitter — so that Fall failures in a
// row span Fall intervals' probes; a result that agrees with the status
// still ends a streak at once.
func TestVerdictCountsIntervalsNotResults(t *testing.T) {
	iv := time.Second
	v := newVerdict(beacon.Check{Kind: beacon.CheckGRPC, Interval: iv, Rise: 2, Fall: 3})
	t0 := time.Unix(0, 0)
	fail := errors.New("NOT_SERVING")
	v.observe(nil, t0)
	for _, d := range []time.Duration{0, 10 * time.Millisecond, 950 * time.Millisecond} { // pushed, then two Checks in 1 s
		if v.observe(fail, t0.Add(iv+d)) {
			t.Fatalf("the verdict changed to %s at %v: three failures within one second (an interval) counted as three", v.status, d)
		}
	}
	if !v.observe(fail, t0.Add(iv+1900*time.Millisecond)) || v.status != Failing {
		t.Fatalf("status %s after failures in three intervals, want failing", v.status)
	}
	v.observe(nil, t0.Add(3*iv))
	v.observe(fail, t0.Add(3*iv+100*time.Millisecond)) // agrees with failing: ends the streak
	if v.observe(nil, t0.Add(4*iv)) {
		t.Fatalf("the verdict changed to %s after one pass since a failure, want still failing (rise 2)", v.status)
	}
}
