package kube

import (
	"testing"
	"time"

	"github.com/beaconplane/beacon"
)

// The verdict that counts where several live checkers' sets hold one: the
// more recent, then that of the smaller set key, whatever the order they
// are met in; none when there is none.
func TestNewerVerdict(t *testing.T) {
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	a := liveVerdict{h: beacon.Health{Status: beacon.HealthFailing, Since: t0}, set: &setInfo{key: "ns/b"}}
	newer := liveVerdict{h: beacon.Health{Status: beacon.HealthPassing, Since: t0.Add(time.Second)}, set: &setInfo{key: "ns/c"}}
	tie := liveVerdict{h: beacon.Health{Status: beacon.HealthPassing, Since: t0}, set: &setInfo{key: "ns/a"}}
	for _, c := range []struct {
		name       string
		x, y, want liveVerdict
	}{
		{"none", liveVerdict{}, liveVerdict{}, liveVerdict{}},
		{"one", liveVerdict{}, a, a},
		{"one, first", a, liveVerdict{}, a},
		{"the more recent", a, newer, newer},
		{"the more recent, first", newer, a, newer},
		{"a tie: the smaller set key", a, tie, tie},
		{"a tie, first", tie, a, tie},
	} {
		if got := newerVerdict(c.x, c.y); got != c.want {
			t.Errorf("%s: %+v, want %+v", c.name, got, c.want)
		}
	}
}
