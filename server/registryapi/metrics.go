package registryapi

import (
	"strconv"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
)

type metrics struct {
	requests *prometheus.CounterVec
	watches  prometheus.Gauge
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{
			Namespace: "beacon", Subsystem: "registry_api", Name: "requests_total",
			Help: "HTTP requests to the registry API, by route and status code.",
		}, []string{"route", "code"}),
		watches: prometheus.NewGauge(prometheus.GaugeOpts{
			Namespace: "beacon", Subsystem: "registry_api", Name: "watch_streams",
			Help: "Open Server-Sent Events watch streams.",
		}),
	}
	if reg == nil {
		return m, nil
	}
	// A second API on the same registerer shares the first one's
	// collectors.
	var err error
	m.requests = promreg.Register(reg, m.requests, &err)
	m.watches = promreg.Register(reg, m.watches, &err)
	if err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) request(route string, code int) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}
