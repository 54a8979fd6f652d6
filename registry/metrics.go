package registry

import (
	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are the registry's Prometheus collectors, as the naming
// resolvers' (naming/internal/publish) are: newMetrics always returns
// working collectors, exported only when Config.Metrics is set. Counts are
// kept with Inc/Dec, so several registries registering on one Registerer
// add up correctly.
type metrics struct {
	state             *prometheus.GaugeVec
	leaseLosses       prometheus.Counter
	recoveries        prometheus.Counter
	keepAliveFailures prometheus.Counter
	unconfirmed       prometheus.Gauge
	registrations     prometheus.Gauge
	conflicts         prometheus.Gauge
	drainedElsewhere  prometheus.Counter
	watchStreams      prometheus.Gauge
	watchers          prometheus.Gauge
	resyncs           *prometheus.CounterVec
	held              *prometheus.CounterVec
	invalid           prometheus.Counter
	healthPanics      prometheus.Gauge
	leased            *leasedCollector // leasedmetrics.go
}

// Metric names, documented in docs/registry.md.
const (
	metricState             = "beacon_registry_session_state"
	metricLeaseLosses       = "beacon_registry_lease_losses_total"
	metricRecoveries        = "beacon_registry_lease_recoveries_total"
	metricKeepAliveFailures = "beacon_registry_keepalive_failures_total"
	metricUnconfirmed       = "beacon_registry_lease_unconfirmed"
	metricRegistrations     = "beacon_registry_registrations"
	metricConflicts         = "beacon_registry_registration_conflicts"
	metricDrainedElsewhere  = "beacon_registry_drained_elsewhere_total"
	metricWatchStreams      = "beacon_registry_watch_streams"
	metricWatchers          = "beacon_registry_watchers"
	metricResyncs           = "beacon_registry_watch_resyncs_total"
	metricHeld              = "beacon_registry_watch_held_removals_total"
	metricInvalid           = "beacon_registry_invalid_values_total"
	metricHealthPanics      = "beacon_registry_health_panic_services"
)

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	f := promreg.With(reg) // nil: counted, not exported
	m := &metrics{
		state: f.GaugeVec(metricState,
			"Number of registry sessions in each state (idle, active, lost, recovered, closed); every state is a series, 0 when no session is in it.", "state"),
		leaseLosses: f.Counter(metricLeaseLosses,
			"Session leases lost: the store said the lease ended (expired or revoked)."),
		recoveries: f.Counter(metricRecoveries,
			"Recoveries after a lease loss: a lease held again and the instances re-registered."),
		keepAliveFailures: f.Counter(metricKeepAliveFailures,
			"Failed keep-alive attempts of session leases."),
		unconfirmed: f.Gauge(metricUnconfirmed,
			"Sessions whose lease no keep-alive renewed for a whole TTL and that the store has not said ended: they keep renewing it (the store unreachable, or an election)."),
		registrations: f.Gauge(metricRegistrations,
			"Instances registered through registry sessions (including conflicted ones); a server's HTTP registrations are in beacon_registry_leased_registrations."),
		conflicts: f.Gauge(metricConflicts,
			"Registered instances not advertised because another live process holds their ID."),
		drainedElsewhere: f.Counter(metricDrainedElsewhere,
			"Instances a registry session advertised serving and found marked draining in the store by someone else (an operator); the session adopted the drain."),
		watchStreams: f.Gauge(metricWatchStreams,
			"Shared store watches (one per watched prefix, shared by every watcher of it)."),
		watchers: f.Gauge(metricWatchers,
			"Open registry watchers."),
		resyncs: f.CounterVec(metricResyncs,
			"Re-lists of a shared watch after compaction or a lost connection.", "reason"),
		held: f.CounterVec(metricHeld,
			"Removals a watch held back as a likely mass lease loss: cancelled by a re-registration of the same ID, or delivered when the hold ended.", "outcome"),
		invalid: f.Counter(metricInvalid,
			"Stored values under the services prefix that are not valid instances or health verdicts (skipped)."),
		healthPanics: f.Gauge(metricHealthPanics,
			"Watched services (namespace/component/endpoint) in health panic: at one of their priorities, more checked instances failing than the panic threshold allows and no other priority taking work, so that its failing instances are served too."),
		leased: promreg.Add(f, newLeasedCollector()),
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) setState(from, to State) {
	if from != to {
		m.state.WithLabelValues(from.String()).Dec()
	}
	m.state.WithLabelValues(to.String()).Inc()
}

func (m *metrics) initState(s State) {
	// Every state is a series from the start, so that an alert on
	// state="lost" compares with 0 rather than with nothing.
	for st := StateIdle; st <= StateClosed; st++ {
		m.state.WithLabelValues(st.String()).Add(0)
	}
	m.state.WithLabelValues(s.String()).Inc()
}

func (m *metrics) trackLeased(t *leasedTracker) {
	m.leased.add(t)
}

func (m *metrics) untrackLeased(t *leasedTracker) {
	m.leased.remove(t)
}

func (m *metrics) leaseLost() {
	m.leaseLosses.Inc()
}

func (m *metrics) recovered() {
	m.recoveries.Inc()
}

func (m *metrics) setUnconfirmed(on bool) {
	if on {
		m.unconfirmed.Inc()
	} else {
		m.unconfirmed.Dec()
	}
}

func (m *metrics) keepAliveFailed() {
	m.keepAliveFailures.Inc()
}

func (m *metrics) addRegistrations(n int) {
	m.registrations.Add(float64(n))
}

func (m *metrics) addConflicts(n int) {
	if n != 0 {
		m.conflicts.Add(float64(n))
	}
}

func (m *metrics) drained() {
	m.drainedElsewhere.Inc()
}

func (m *metrics) addWatchStreams(n int) {
	m.watchStreams.Add(float64(n))
}

func (m *metrics) addWatchers(n int) {
	m.watchers.Add(float64(n))
}

func (m *metrics) resync(reason string) {
	m.resyncs.WithLabelValues(reason).Inc()
}

func (m *metrics) heldRemoval(outcome string) {
	m.held.WithLabelValues(outcome).Inc()
}

func (m *metrics) invalidValue() {
	m.invalid.Inc()
}

func (m *metrics) addHealthPanics(n int) {
	m.healthPanics.Add(float64(n))
}
