package kube

import (
	"time"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// Metric names, documented in docs/kubernetes.md.
const (
	metricInvalid       = "beacon_kube_invalid_resources_total"
	metricInvalidEntry  = "beacon_kube_invalid_entries_total"
	metricWrites        = "beacon_kube_writes_total"
	metricWriteSeconds  = "beacon_kube_write_duration_seconds"
	metricRelists       = "beacon_kube_relists_total"
	metricWatchers      = "beacon_kube_watchers"
	metricRegistrations = "beacon_kube_registrations"
	// metricHealthPanics is the store registries' gauge, under the same
	// name, so that one alert serves every backend.
	metricHealthPanics = "beacon_registry_health_panic_services"
)

// metrics are the registry's collectors: newMetrics always returns working
// ones, exported only when a Registerer is given.
type metrics struct {
	invalid        prometheus.Counter
	invalidEntries prometheus.Counter
	writes         *prometheus.CounterVec
	writeSeconds   prometheus.Histogram
	relists        prometheus.Counter
	watching       prometheus.Gauge
	registered     prometheus.Gauge
	panics         prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	f := promreg.With(reg) // nil: counted, not exported
	m := &metrics{
		invalid: f.Counter(metricInvalid,
			"InstanceSet (or DynamoWorkerMetadata) versions skipped because they are not valid (their last valid content is kept)."),
		invalidEntries: f.Counter(metricInvalidEntry,
			"Entries of DynamoWorkerMetadata versions skipped because Beacon cannot serve them (malformed, or an instance ID held twice)."),
		writes: f.CounterVec(metricWrites,
			"Server-side applies of this process's InstanceSet, by result (ok, error).", "result"),
		writeSeconds: f.Histogram(metricWriteSeconds,
			"Duration of the server-side applies of this process's InstanceSet.", prometheus.ExponentialBuckets(0.001, 2, 14)),
		relists: f.Counter(metricRelists,
			"Re-lists of a watched resource after the first listing (410 Gone, a lost connection)."),
		watching: f.Gauge(metricWatchers,
			"Open watchers of Kubernetes registries."),
		registered: f.Gauge(metricRegistrations,
			"Instances registered through Kubernetes registries."),
		panics: f.Gauge(metricHealthPanics,
			"Watched services (namespace/component/endpoint) in health panic: at one of their priorities, more checked instances failing than the panic threshold allows and no other priority taking work, so that its failing instances are served too."),
	}
	return m, f.Err()
}

func (m *metrics) invalidResource() {
	m.invalid.Inc()
}

func (m *metrics) invalidEntry() {
	m.invalidEntries.Inc()
}

func (m *metrics) write(err error, d time.Duration) {
	result := "ok"
	if err != nil {
		result = "error"
	}
	m.writes.WithLabelValues(result).Inc()
	m.writeSeconds.Observe(d.Seconds())
}

func (m *metrics) relist() {
	m.relists.Inc()
}

func (m *metrics) watchers(n int) {
	m.watching.Add(float64(n))
}

func (m *metrics) registrations(n int) {
	m.registered.Add(float64(n))
}

func (m *metrics) healthPanics(n int) {
	m.panics.Add(float64(n))
}
