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
	m := &metrics{
		probes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beacon_health_probes_total",
			Help: "Probes this checker made, by check kind (grpc, http, tcp, ttl) and result (pass, fail).",
		}, []string{"kind", "result"}),
		duration: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "beacon_health_probe_duration_seconds",
			Help:    "How long this checker's probes took, by check kind.",
			Buckets: prometheus.ExponentialBuckets(0.001, 4, 8),
		}, []string{"kind"}),
		changes: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "beacon_health_verdict_changes_total",
			Help: "Changes of verdict this checker reached, by new status (passing, failing).",
		}, []string{"status"}),
		owned: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "beacon_health_owned_instances",
			Help: "Instances this checker owns and checks (its share of the instances that declare a check).",
		}),
		cutOff: prometheus.NewGauge(prometheus.GaugeOpts{
			Name: "beacon_health_checker_cut_off",
			Help: "1 while this checker finds itself cut off (it then writes no failing verdict), else 0.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	var err error
	m.probes = promreg.Register(reg, m.probes, &err)
	m.duration = promreg.Register(reg, m.duration, &err)
	m.changes = promreg.Register(reg, m.changes, &err)
	m.owned = promreg.Register(reg, m.owned, &err)
	m.cutOff = promreg.Register(reg, m.cutOff, &err)
	return m, err
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
