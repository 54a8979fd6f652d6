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
	// A second API on the same registerer shares the first one's
	// collectors.
	f := promreg.With(reg)
	m := &metrics{
		requests: f.CounterVec("beacon_registry_api_requests_total",
			"HTTP requests to the registry API, by route and status code.", "route", "code"),
		watches: f.Gauge("beacon_registry_api_watch_streams",
			"Open Server-Sent Events watch streams."),
	}
	if err := f.Err(); err != nil {
		return nil, err
	}
	return m, nil
}

func (m *metrics) request(route string, code int) {
	m.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
}
