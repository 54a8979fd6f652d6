// Package defaults fills in what a registrant may leave out of an
// instance, the same way for every registry backend (the store-backed
// registry and registry/kube).
package defaults

import (
	"time"

	"github.com/beaconplane/beacon"
)

// HealthPanicThreshold is the share of a service's checked instances
// that may be failing before health is ignored for the service (its panic
// threshold) when the configuration leaves it zero.
const HealthPanicThreshold = 0.5

// Fill returns in with its defaults filled in — a new ID, status serving,
// registered now (UTC, to the millisecond) — and RegisteredAt in UTC,
// validated with a metadata limit of maxMetadata bytes. The result shares
// in's Metadata map and Check: a caller that keeps it, or hands it back,
// keeps a Clone (one that only encodes it need not copy the map).
func Fill(in beacon.Instance, maxMetadata int) (beacon.Instance, error) {
	if in.ID == "" {
		in.ID = beacon.NewID()
	}
	if in.Status == "" {
		in.Status = beacon.StatusServing
	}
	if in.RegisteredAt.IsZero() {
		in.RegisteredAt = time.Now().UTC().Truncate(time.Millisecond)
	} else {
		in.RegisteredAt = in.RegisteredAt.UTC()
	}
	if err := in.ValidateWith(maxMetadata); err != nil {
		return beacon.Instance{}, err
	}
	return in, nil
}
