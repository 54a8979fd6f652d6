package publish

import (
	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, shared by every resolver scheme (the "scheme" label tells
// them apart), so that one Registerer can serve both beacon and etcd
// resolvers.
const (
	MetricResolvers = "beacon_naming_resolvers"
	MetricUpdates   = "beacon_naming_state_updates_total"
	MetricErrors    = "beacon_naming_resolver_errors_total"
	MetricSkipped   = "beacon_naming_skipped_total"
	MetricResyncs   = "beacon_naming_resyncs_total"
)

// Reasons, the values of the "reason" label.
const (
	ReasonStale       = "stale"        // the watch lost its backend
	ReasonWatchFailed = "watch_failed" // the watch ended with an error
	ReasonClosed      = "closed"       // the registry or store is closed
	ReasonNoInstances = "no_instances" // nothing to dial
	ReasonCompacted   = "compacted"    // the watch fell behind compaction
	ReasonReconnect   = "reconnect"    // the backend answers again
	ReasonInvalidJSON = "invalid_json" // a stored value that is not JSON
	ReasonNoAddr      = "no_addr"      // a stored value without Addr
	ReasonNotDialable = "not_dialable" // an address gRPC cannot dial
	ReasonDuplicate   = "duplicate_address"
)

// Metrics are the Prometheus collectors of the naming resolvers. The zero
// value is not usable; NewMetrics always returns working collectors, which
// are only exported when a Registerer was given.
type Metrics struct {
	resolvers *prometheus.GaugeVec
	updates   *prometheus.CounterVec
	errors    *prometheus.CounterVec
	skipped   *prometheus.CounterVec
	resyncs   *prometheus.CounterVec
}

// NewMetrics returns the collectors, registered on reg when it is not nil.
// Collectors that reg already holds (another builder registered them) are
// shared.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	f := promreg.With(reg)
	m := &Metrics{
		resolvers: f.GaugeVec(MetricResolvers,
			"Name resolvers running (one per gRPC channel and target).", "scheme"),
		updates: f.CounterVec(MetricUpdates,
			"Resolver states pushed to gRPC (each a full list of endpoints).", "scheme"),
		errors: f.CounterVec(MetricErrors,
			"Errors reported to gRPC by name resolvers, by reason (stale, watch_failed, closed, no_instances).", "scheme", "reason"),
		skipped: f.CounterVec(MetricSkipped,
			"Entries left out of a resolver state, by reason (invalid_json, no_addr, not_dialable, duplicate_address).", "scheme", "reason"),
		resyncs: f.CounterVec(MetricResyncs,
			"Full re-listings after a broken watch, by reason (compacted, watch_failed, reconnect).", "scheme", "reason"),
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

// AddResolvers adds n (possibly negative) to the running resolvers.
func (m *Metrics) AddResolvers(scheme string, n int) {
	m.resolvers.WithLabelValues(scheme).Add(float64(n))
}

// Update counts one state pushed to gRPC.
func (m *Metrics) Update(scheme string) { m.updates.WithLabelValues(scheme).Inc() }

// Error counts one error reported to gRPC.
func (m *Metrics) Error(scheme, reason string) { m.errors.WithLabelValues(scheme, reason).Inc() }

// Skipped counts one entry left out of a state.
func (m *Metrics) Skipped(scheme, reason string) { m.skipped.WithLabelValues(scheme, reason).Inc() }

// Resync counts one re-listing.
func (m *Metrics) Resync(scheme, reason string) { m.resyncs.WithLabelValues(scheme, reason).Inc() }
