package health

import (
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

// metrics are a Checker's Prometheus collectors. Checkers sharing one
// Registerer share them.
type metrics struct {
	probes   *prometheus.CounterVec   // beacon_health_probes_total{kind,result}
	duration *prometheus.HistogramVec // beacon_health_probe_duration_seconds{kind}
	changes  *prometheus.CounterVec   // beacon_health_verdict_changes_total{status}
	owned    prometheus.Gauge         // beacon_health_owned_instances
	cutOff   prometheus.Gauge         // beacon_health_checker_cut_off
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	f := promreg.With(reg)
	m := &metrics{
		probes: f.CounterVec("beacon_health_probes_total",
			"Probes this checker made, by check kind (grpc, http, tcp, ttl) and result (pass, fail).", "kind", "result"),
		duration: f.HistogramVec("beacon_health_probe_duration_seconds",
			"How long this checker's probes took, by check kind.", prometheus.ExponentialBuckets(0.001, 4, 8), "kind"),
		changes: f.CounterVec("beacon_health_verdict_changes_total",
			"Changes of verdict this checker reached, by new status (passing, failing).", "status"),
		owned: f.Gauge("beacon_health_owned_instances",
			"Instances this checker owns and checks (its share of the instances that declare a check)."),
		cutOff: f.Gauge("beacon_health_checker_cut_off",
			"1 while this checker finds itself cut off (it then writes no failing verdict), else 0."),
	}
	return m, f.Err()
}

// probe counts one probe of a check of kind.
func (m *metrics) probe(kind beacon.CheckKind, result error, took time.Duration) {
	r := "pass"
	if result != nil {
		r = "fail"
	}
	m.probes.WithLabelValues(string(kind), r).Inc()
	m.duration.WithLabelValues(string(kind)).Observe(took.Seconds())
}
