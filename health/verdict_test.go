package health

import (
	"errors"
	"testing"

	"github.com/beaconplane/beacon"
)

// run observes results, a sequence of check results: 'p' passed, 'f' failed.
func run(t *testing.T, rise, fall int, results string) (statuses string, changes int) {
	t.Helper()
	v := newVerdict(beacon.Check{Kind: beacon.CheckTCP, Rise: rise, Fall: fall})
	for _, r := range results {
		var res error
		if r == 'f' {
			res = errors.New("refused")
		}
		if v.observe(res) {
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
	v.observe(errors.New("first"))
	v.observe(errors.New("second"))
	if v.status != Failing || v.reason == nil || v.reason.Error() != "second" {
		t.Fatalf("status %s reason %v, want failing with the last failure", v.status, v.reason)
	}
	v.observe(nil)
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
