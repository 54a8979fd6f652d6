package registry

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

// TTL checks' reports.
//
// An instance that declares a TTL check (beacon.CheckTTL) passes while its
// registrant says, at least once per the check's TTL, that it is fine: an
// application-level heartbeat, apart from the lease, which only proves
// that the process reaches the store. The registrant writes a report at
// the instance's key followed by "/report" (ReportKey), {"at": the time,
// RFC 3339 with nanoseconds}, bound to the instance's own lease, so that
// it goes with the instance; the checker that owns the instance reads it
// every beacon.TTLReadInterval (and when the last one turns one TTL old),
// and the registry's view ignores it. Report writes it
// for an instance registered through the registry's session (bound to the
// session's lease), ReportLeased for one registered with RegisterWithTTL
// (bound to its lease; the owner presents the secret, as for Heartbeat).
// Both refuse an instance that declares no TTL check.

// ReportSuffix ends the key of a TTL check's report: the instance's key
// followed by "/report", bound to the instance's own lease.
const ReportSuffix = "/report"

// ReportKey returns the store key of the TTL check's report on the
// instance at ref. It does not validate ref.
func ReportKey(ks beacon.Keyspace, ref beacon.Ref) string { return ks.Key(ref) + ReportSuffix }

// TTLReport is the value of a TTL check's report (ReportKey): when the
// registrant last said its instance is fine.
type TTLReport struct {
	At time.Time `json:"at"`
}

// ParseTTLReport reads the value of a TTL check's report.
func ParseTTLReport(val []byte) (TTLReport, error) {
	var rep TTLReport
	if err := decodeOne(val, &rep); err != nil {
		return TTLReport{}, fmt.Errorf("registry: decode TTL report: %w", err)
	}
	if rep.At.IsZero() {
		return TTLReport{}, errors.New(`registry: decode TTL report: no "at" time`)
	}
	return rep, nil
}

// newReport is the value of a report made now.
func newReport() []byte {
	val, _ := json.Marshal(TTLReport{At: time.Now().UTC()}) // a time.Time always marshals
	return val
}

// ttlChecked refuses a report for in unless it declares a TTL check.
func ttlChecked(in beacon.Instance) error {
	switch {
	case in.Check == nil:
		return fmt.Errorf("%w: %w: %s declares no check: declare a ttl check (beacon.Check{Kind: beacon.CheckTTL, TTL: ...}) when registering it to report for it",
			ErrNoTTLCheck, beacon.ErrInvalid, in.Ref())
	case in.Check.Kind != beacon.CheckTTL:
		return fmt.Errorf("%w: %w: %s declares a %s check, which the checkers probe: only a ttl check is reported by the service",
			ErrNoTTLCheck, beacon.ErrInvalid, in.Ref(), in.Check.Kind)
	}
	return nil
}

// Report writes a report of the TTL check of the instance at ref, which
// this registry registered (Register), bound to the session's lease. An
// instance this registry did not register gives an error matching
// beacon.ErrNotFound; one that declares no TTL check ErrNoTTLCheck; one
// another live process holds (a conflict) that conflict's error. While
// the session recovers a lost lease, Report waits for it (bounded by
// ctx).
func (r *StoreRegistry) Report(ctx context.Context, ref beacon.Ref) error {
	if err := r.checkOperatorWrite("report a TTL check", ref); err != nil {
		return err
	}
	reg := r.sess.rc.admitted(r.ks.Key(ref))
	if reg == nil {
		return fmt.Errorf("%w: %s is not registered through this registry (for a registration made with RegisterWithTTL, use ReportLeased)",
			beacon.ErrNotFound, ref)
	}
	return reg.report(ctx)
}

// report writes reg's report under the session's lease.
func (reg *registration) report(ctx context.Context) error {
	if err := ttlChecked(reg.Instance()); err != nil {
		return err
	}
	reg.opMu.Lock()
	defer reg.opMu.Unlock()
	for {
		lease, _, err := reg.s.acquire(ctx)
		if err != nil {
			return err
		}
		reg.wmu.Lock()
		if reg.removed {
			reg.wmu.Unlock()
			return fmt.Errorf("%w: %s was deregistered", beacon.ErrNotFound, reg.ref)
		}
		if o := reg.rc.outcome(reg); o.err != nil {
			reg.wmu.Unlock()
			return fmt.Errorf("registry: report %s: %w", reg.ref, o.err)
		}
		_, err = reg.r.st.Put(ctx, reg.key+ReportSuffix, newReport(), store.WithLease(lease))
		reg.reported = reg.reported || err == nil
		reg.wmu.Unlock()
		if !errors.Is(err, store.ErrLeaseNotFound) {
			if err != nil {
				return fmt.Errorf("registry: report %s: %w", reg.ref, err)
			}
			return nil
		}
		reg.s.leaseGone(lease, err)
	}
}

// ReportLeased writes a report of the TTL check of the registration at
// ref, whose secret the caller presents (RegisterWithTTL), bound to the
// registration's own lease. A wrong secret, an unknown instance and an
// ended lease answer as Heartbeat does (an error matching
// beacon.ErrNotFound, or store.ErrPermissionDenied for a caller the store
// does not allow the write); an owner's instance that declares no TTL
// check gives ErrNoTTLCheck.
func (r *StoreRegistry) ReportLeased(ctx context.Context, ref beacon.Ref, secret Secret) error {
	in, kv, err := r.getOwned(ctx, ref, secret, "report a TTL check", "report")
	if err != nil {
		return err
	}
	if err := ttlChecked(in); err != nil {
		return err
	}
	if _, err := r.st.Put(ctx, kv.Key+ReportSuffix, newReport(), store.WithLease(kv.Lease)); err != nil {
		return r.ownedWriteError("report", ref, kv.Lease, err)
	}
	return nil
}
