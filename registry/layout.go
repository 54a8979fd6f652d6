package registry

import (
	"errors"
	"fmt"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/dynamo"
)

// Layout is what a StoreRegistry reads in its store: Beacon's own keys, or
// a read-only view of what another writer stores.
type Layout string

const (
	// LayoutBeacon is Beacon's key layout, {root}/services/...: read and
	// written. The zero Layout is LayoutBeacon.
	LayoutBeacon Layout = "beacon"
	// LayoutDynamo is a read-only view of what the NVIDIA Dynamo runtime
	// writes: its instances (v1/instances/...) with the model names of
	// their cards (v1/mdc/...), decoded by package dynamo. Lists and
	// watches work as over Beacon's layout; every write is refused
	// (ErrReadOnlyLayout).
	LayoutDynamo Layout = "dynamo"
	// LayoutEnv names the variable ConfigFromEnv reads the layout from.
	LayoutEnv = "BEACON_LAYOUT"
)

// maxReported bounds the bad Dynamo entries the registry remembers as
// reported (reporter).
const maxReported = 4096

// ErrReadOnlyLayout reports a write (a registration, a heartbeat, an
// operator's drain...) to a registry whose layout is a read-only view of
// what another writer stores.
var ErrReadOnlyLayout = errors.New("registry: the dynamo layout is a read-only view of what the Dynamo runtime writes")

// ParseLayout reads a layout's name: "beacon" (or "") or "dynamo".
func ParseLayout(s string) (Layout, error) {
	switch l := Layout(strings.TrimSpace(s)); l {
	case "", LayoutBeacon:
		return LayoutBeacon, nil
	case LayoutDynamo:
		return LayoutDynamo, nil
	}
	return "", fmt.Errorf("%w: layout %q: use %s (Beacon's keys, the default) or %s (a read-only view of what the Dynamo runtime writes)",
		ErrInvalidConfig, s, LayoutBeacon, LayoutDynamo)
}

// String returns the layout's name ("beacon" for the zero Layout).
func (l Layout) String() string {
	if l == "" {
		return string(LayoutBeacon)
	}
	return string(l)
}

func (l Layout) validate(root string) error {
	if _, err := ParseLayout(string(l)); err != nil {
		return err
	}
	if l == LayoutDynamo && root != "" {
		return fmt.Errorf("%w: Root %q: the dynamo layout reads the Dynamo runtime's own keys (%s...), which have no root",
			ErrInvalidConfig, root, dynamo.Root)
	}
	return nil
}

// Layout returns the registry's layout.
func (r *StoreRegistry) Layout() Layout { return r.cfg.Layout }

// LayoutOf returns the layout of d: its Layout() when it has one (a
// StoreRegistry, or a type embedding one), LayoutBeacon otherwise.
// Consumers that tell a name of no service from a service with no
// instances (xDS) take the read rules of beacon.Query.Validate for a
// registry of the dynamo layout, the writers' labels otherwise.
func LayoutOf(d Discoverer) Layout {
	if l, ok := d.(interface{ Layout() Layout }); ok && l.Layout() == LayoutDynamo {
		return LayoutDynamo
	}
	return LayoutBeacon
}

func (r *StoreRegistry) dynamo() bool { return r.cfg.Layout == LayoutDynamo }

// CheckWritable returns the error every write gets when the layout is
// read-only (ErrReadOnlyLayout, saying that action is refused and what to
// do instead), nil when the registry takes writes: for servers that refuse
// a request before they prepare it.
func (r *StoreRegistry) CheckWritable(action string) error { return r.refuseWrite(action) }

// refuseWrite refuses action when the layout is read-only.
func (r *StoreRegistry) refuseWrite(action string) error {
	if !r.dynamo() {
		return nil
	}
	return fmt.Errorf("%w: %s refused: the Dynamo runtime's workers write these entries (%s..., %s...) and their leases "+
		"decide when they go; register through Dynamo's runtime, or run Beacon with its own layout (Config.Layout %s, %s unset) "+
		"for Beacon's registrations (docs/dynamo.md)", ErrReadOnlyLayout, action, dynamo.InstancesPrefix, dynamo.ModelsPrefix,
		LayoutBeacon, LayoutEnv)
}

// checkQuery validates q against the names the layout holds: Beacon's
// writers' labels in Beacon's layout (a query of other names is refused,
// as it always was), the read rules in the dynamo layout.
func (r *StoreRegistry) checkQuery(q beacon.Query) error {
	if r.dynamo() {
		return q.Validate()
	}
	return q.ValidateWritten()
}

// checkRef is checkQuery for a ref.
func (r *StoreRegistry) checkRef(ref beacon.Ref) error {
	if r.dynamo() {
		return ref.Validate()
	}
	return ref.ValidateWritten()
}

// ReadPrefix returns the store prefix a List or Watch of q reads: the
// query's prefix in Beacon's layout; Dynamo's whole root in the dynamo
// layout, whose instances and cards live in two buckets (the view keeps
// q's entries). It is the key range to authorize before serving q to
// someone else from this registry: etcd asks read permission on exactly
// that range of a registry acting as the reader.
func (r *StoreRegistry) ReadPrefix(q beacon.Query) string {
	if r.dynamo() {
		return dynamo.Root
	}
	return r.ks.Prefix(q)
}

// feedKey returns the key of q's shared feed: its store prefix in
// Beacon's layout, where the prefix selects q; the query in the dynamo
// layout, whose feeds all watch Dynamo's root.
func (r *StoreRegistry) feedKey(q beacon.Query) string {
	if r.dynamo() {
		return dynamo.Root + "?" + q.String()
	}
	return r.ks.Prefix(q)
}
