package registry

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/memory"
)

// A report that reaches a registration after it was closed (a race with
// Close), or while another live process holds its ID, is refused and
// writes nothing: it would outlive the instance, or vouch for another's.
func TestReportRefusedForAClosedOrConflictedRegistration(t *testing.T) {
	st := memory.New(memory.Config{})
	t.Cleanup(func() { _ = st.Close() })
	r, err := New(st, Config{})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	in := beacon.Instance{Namespace: "report", Component: "c", Endpoint: "e", Address: "10.0.0.1:80",
		Check: &beacon.Check{Kind: beacon.CheckTTL, TTL: time.Minute}}
	reg := mustRegister(t, ctx, r, in)
	held := errors.New("held by another live process")
	r.sess.mu.Lock()
	epoch := r.sess.epoch
	r.sess.mu.Unlock()
	r.sess.rc.setWritten(reg, epoch, held)
	if err := reg.report(ctx); !errors.Is(err, held) {
		t.Fatalf("a report for a conflicted registration: %v, want its conflict", err)
	}
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	reg = mustRegister(t, ctx, r, in)
	if err := reg.Close(); err != nil {
		t.Fatal(err)
	}
	if err := reg.report(ctx); !errors.Is(err, beacon.ErrNotFound) {
		t.Fatalf("a report for a closed registration: %v, want ErrNotFound", err)
	}
	if _, err := st.Get(ctx, reg.key+ReportSuffix); !errors.Is(err, store.ErrNotFound) {
		t.Fatalf("a refused report was stored: %v", err)
	}
}

func mustRegister(t *testing.T, ctx context.Context, r *StoreRegistry, in beacon.Instance) *registration {
	t.Helper()
	g, err := r.Register(ctx, in)
	if err != nil {
		t.Fatal(err)
	}
	return g.(*registration)
}
