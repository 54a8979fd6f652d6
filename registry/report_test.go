package registry_test

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

func withCheck(in beacon.Instance, c *beacon.Check) beacon.Instance {
	in.Check = c
	return in
}

var ttlCheck = &beacon.Check{Kind: beacon.CheckTTL, TTL: 30 * time.Second}

// wantReport fails unless the report of ref is stored, made within the
// last minute, bound to lease.
func wantReport(t *testing.T, ctx context.Context, st store.Store, r *registry.StoreRegistry, ref beacon.Ref, lease store.LeaseID) {
	t.Helper()
	kv, err := st.Get(ctx, registry.ReportKey(r.Keyspace(), ref))
	if err != nil {
		t.Fatalf("the report of %s: %v", ref, err)
	}
	rep, err := registry.ParseTTLReport(kv.Value)
	if err != nil || time.Since(rep.At) > time.Minute || rep.At.After(time.Now().Add(time.Second)) {
		t.Fatalf("report %s: %+v, %v; want one made now", kv.Value, rep, err)
	}
	if kv.Lease != lease {
		t.Fatalf("report on lease %x, want %x", kv.Lease, lease)
	}
}

// An HTTP registration's owner reports for its TTL check with its secret,
// under the registration's own lease: gone with it. A wrong secret answers
// as an unknown instance; an instance without a TTL check is refused.
func TestReportLeased(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			ns := uniqueNS()
			ctx := within(t, 30*time.Second)
			o, err := r.RegisterWithTTL(ctx, withCheck(inst(ns, "10.0.0.1:80"), ttlCheck), b.ttl)
			if err != nil {
				t.Fatal(err)
			}
			ref := o.Instance.Ref()
			if err := r.ReportLeased(ctx, ref, o.Secret); err != nil {
				t.Fatal(err)
			}
			wantReport(t, ctx, st, r, ref, o.Lease.ID)
			if err := r.ReportLeased(ctx, ref, registry.NewSecret()); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("a report with a wrong secret: %v, want ErrNotFound", err)
			}
			for _, c := range []*beacon.Check{nil, {Kind: beacon.CheckTCP}} {
				other, err := r.RegisterWithTTL(ctx, withCheck(inst(ns, "10.0.0.2:80"), c), b.ttl)
				if err != nil {
					t.Fatal(err)
				}
				err = r.ReportLeased(ctx, other.Instance.Ref(), other.Secret)
				if !errors.Is(err, registry.ErrNoTTLCheck) || !errors.Is(err, beacon.ErrInvalid) {
					t.Fatalf("a report for check %v: %v, want ErrNoTTLCheck and ErrInvalid", c, err)
				}
				if _, err := st.Get(ctx, registry.ReportKey(r.Keyspace(), other.Instance.Ref())); !errors.Is(err, store.ErrNotFound) {
					t.Fatalf("a refused report was stored: %v", err)
				}
			}
			if err := r.DeregisterLeased(ctx, ref, o.Secret); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Get(ctx, registry.ReportKey(r.Keyspace(), ref)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the report outlived its registration's lease: %v", err)
			}
			if err := r.ReportLeased(ctx, ref, o.Secret); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("a report for a deregistered instance: %v, want ErrNotFound", err)
			}
		})
	}
}

// A process reports for the TTL checks of the instances its registry
// registered, under its session's lease; the report goes when the
// registration is closed. An instance it did not register, or one without
// a TTL check, is refused.
func TestReportSession(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			t.Parallel()
			st := b.store(t)
			r := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			ns := uniqueNS()
			ctx := within(t, 30*time.Second)
			reg, err := r.Register(ctx, withCheck(inst(ns, "10.0.0.1:80"), ttlCheck))
			if err != nil {
				t.Fatal(err)
			}
			ref := reg.Instance().Ref()
			if err := r.Report(ctx, ref); err != nil {
				t.Fatal(err)
			}
			wantReport(t, ctx, st, r, ref, r.Lease())
			// The session's lease ends behind its back: the report waits
			// for the recovery and goes under the new lease.
			lost := r.Lease()
			if err := st.Revoke(ctx, lost); err != nil {
				t.Fatal(err)
			}
			if err := r.Report(ctx, ref); err != nil {
				t.Fatalf("a report after the lease ended: %v", err)
			}
			if r.Lease() == lost {
				t.Fatal("the report went through on the ended lease")
			}
			wantReport(t, ctx, st, r, ref, r.Lease())
			plain, err := r.Register(ctx, inst(ns, "10.0.0.2:80"))
			if err != nil {
				t.Fatal(err)
			}
			if err := r.Report(ctx, plain.Instance().Ref()); !errors.Is(err, registry.ErrNoTTLCheck) {
				t.Fatalf("a report for an instance without a check: %v, want ErrNoTTLCheck", err)
			}
			other := newRegistry(t, st, registry.Config{LeaseTTL: b.ttl})
			if err := other.Report(ctx, ref); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("a report from another process: %v, want ErrNotFound", err)
			}
			if err := reg.Close(); err != nil {
				t.Fatal(err)
			}
			if _, err := st.Get(ctx, registry.ReportKey(r.Keyspace(), ref)); !errors.Is(err, store.ErrNotFound) {
				t.Fatalf("the report outlived its registration: %v", err)
			}
			if err := r.Report(ctx, ref); !errors.Is(err, beacon.ErrNotFound) {
				t.Fatalf("a report for a closed registration: %v, want ErrNotFound", err)
			}
		})
	}
}

func TestParseTTLReport(t *testing.T) {
	rep, err := registry.ParseTTLReport([]byte(`{"at":"2026-01-02T03:04:05.123456789Z"}`))
	if err != nil || !rep.At.Equal(time.Date(2026, 1, 2, 3, 4, 5, 123456789, time.UTC)) {
		t.Fatalf("ParseTTLReport = %+v, %v", rep, err)
	}
	for _, bad := range []string{``, `{}`, `{"at":"yesterday"}`, `{"at":"2026-01-02T03:04:05Z"} x`, "{\"at\":\"\xff\"}"} {
		if _, err := registry.ParseTTLReport([]byte(bad)); err == nil {
			t.Errorf("ParseTTLReport(%q) accepted it", bad)
		}
	}
}
