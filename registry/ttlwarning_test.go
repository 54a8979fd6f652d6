package registry_test

import (
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/registry"
)

func TestTTLWarning(t *testing.T) {
	for _, c := range []struct {
		ttl  time.Duration
		warn bool
	}{
		{0, false}, {time.Second, true}, {2 * time.Second, true}, {3 * time.Second, true},
		{registry.MinElectionTTL - time.Millisecond, true}, {registry.MinElectionTTL, false}, {time.Minute, false},
	} {
		w := registry.TTLWarning(c.ttl)
		if (w != "") != c.warn {
			t.Errorf("TTLWarning(%v) = %q, want a warning: %v", c.ttl, w, c.warn)
		}
		if c.warn && (!strings.Contains(w, c.ttl.String()) || !strings.Contains(w, registry.MinElectionTTL.String())) {
			t.Errorf("TTLWarning(%v) = %q: names neither the TTL nor the minimum", c.ttl, w)
		}
	}
}

// TestSessionWarnsBelowElectionTTL: a session whose TTL is below
// MinElectionTTL logs the warning when it takes its lease; one at it does
// not.
func TestSessionWarnsBelowElectionTTL(t *testing.T) {
	for _, ttl := range []time.Duration{3 * time.Second, registry.MinElectionTTL} {
		var logs syncbuf.Buffer
		r := newRegistry(t, newMemoryStore(t), registry.Config{LeaseTTL: ttl, Logger: slog.New(slog.NewTextHandler(&logs, nil))})
		if _, err := r.Register(within(t, 10*time.Second), inst(uniqueNS(), "10.0.0.1:80")); err != nil {
			t.Fatal(err)
		}
		warned := strings.Contains(logs.String(), "level=WARN") && strings.Contains(logs.String(), "rides out an etcd leader election")
		if warned != (ttl < registry.MinElectionTTL) {
			t.Errorf("TTL %v: warned %v; logs:\n%s", ttl, warned, logs.String())
		}
	}
}
