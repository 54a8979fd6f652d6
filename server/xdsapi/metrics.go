package xdsapi

import (
	"fmt"
	"strings"
	"sync"
	"time"

	"github.com/beaconplane/beacon/internal/promreg"
	discoveryv3 "github.com/envoyproxy/go-control-plane/envoy/service/discovery/v3"
	"github.com/prometheus/client_golang/prometheus"
)

// maxClientLabels bounds the distinct user agents counted under their own
// label; later ones count as "other", so that clients cannot grow the
// series without bound.
const maxClientLabels = 16

type metrics struct {
	responses   *prometheus.CounterVec
	resources   *prometheus.CounterVec
	marshals    *prometheus.CounterVec
	nacks       *prometheus.CounterVec
	refused     *prometheus.CounterVec
	unknownType prometheus.Counter
	denied      prometheus.Counter
	ackTimeouts prometheus.Counter

	respByType [numTypes + 1]prometheus.Counter
	resByType  [numTypes + 1]prometheus.Counter
	marByType  [numTypes]prometheus.Counter

	mu      sync.Mutex
	clients map[string]string // user agent → label
}

func newMetrics(reg prometheus.Registerer, s *Server) (*metrics, error) {
	f := promreg.With(nil) // registered below, not shared: a second server on one Registerer is an error
	m := &metrics{
		responses: f.CounterVec("beacon_xds_responses_total",
			"xDS responses sent, by resource type (listener, cluster, endpoint, other).", "type"),
		resources: f.CounterVec("beacon_xds_resources_sent_total",
			"Resources sent in xDS responses, by type.", "type"),
		marshals: f.CounterVec("beacon_xds_marshals_total",
			"Resources encoded, by type: once per change of a service, shared by every stream that sends it.", "type"),
		nacks: f.CounterVec("beacon_xds_nacks_total",
			"Responses a client refused (NACK), by type and client (the node's user_agent_name); the log says why.", "type", "client"),
		refused: f.CounterVec("beacon_xds_streams_refused_total",
			"ADS streams refused at their start, or ended for a request past a bound, by reason (max_streams, max_streams_per_client, max_names_per_stream, max_names_per_client, unauthenticated).", "reason"),
		unknownType: f.Counter("beacon_xds_unknown_type_requests_total",
			"Subscriptions to a resource type Beacon serves none of (answered empty)."),
		denied: f.Counter("beacon_xds_namespaces_denied_total",
			"Namespaces a stream's client asked for and may not read (answered as if they held nothing)."),
		ackTimeouts: f.Counter("beacon_xds_ack_timeouts_total",
			"Streams ended because the client answered no response within the ACK timeout while newer state waited."),
		clients: map[string]string{},
	}
	for t := range numTypes + 1 {
		name := typeName(t)
		if t < numTypes {
			m.marByType[t] = m.marshals.WithLabelValues(name)
		}
		m.respByType[t] = m.responses.WithLabelValues(name)
		m.resByType[t] = m.resources.WithLabelValues(name)
	}
	if reg == nil {
		return m, nil
	}
	cs := []prometheus.Collector{
		m.responses, m.resources, m.marshals, m.nacks, m.refused, m.unknownType, m.denied, m.ackTimeouts,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beacon_xds_streams", Help: "ADS streams open."},
			func() float64 { return float64(s.streamCount()) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beacon_xds_services", Help: "Services with instances, each served as a Listener, a Cluster and a ClusterLoadAssignment."},
			func() float64 { n, _ := s.idx.counts(); return float64(n) }),
		&omittedCollector{s: s},
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beacon_xds_ready", Help: "1 once xDS holds the registry's first snapshot (streams are answered from then on)."},
			func() float64 {
				if s.idx.isReady() {
					return 1
				}
				return 0
			}),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "beacon_xds_stale_seconds", Help: "Seconds since the registry watch behind xDS lost its store (0 while it is live); clients keep the last state meanwhile."},
			func() float64 {
				if since, _ := s.idx.stale(); !since.IsZero() {
					return time.Since(since).Seconds()
				}
				return 0
			}),
	}
	if err := promreg.RegisterEach(reg, cs...); err != nil {
		return nil, fmt.Errorf("xds metrics: %w", err)
	}
	return m, nil
}

// marshalled counts n resources of type t encoded.
func (m *metrics) marshalled(t rtype, n int) { m.marByType[t].Add(float64(n)) }

// sentResponse counts one response sent.
func (m *metrics) sentResponse(resp *discoveryv3.DiscoveryResponse) {
	t, _ := typeOf(resp.GetTypeUrl())
	m.respByType[t].Inc()
	m.resByType[t].Add(float64(len(resp.GetResources())))
}

// typeName labels a type in metrics and logs.
func typeName(t rtype) string {
	if t < numTypes {
		return typeNames[t]
	}
	return "other"
}

// clientLabel returns the metrics label of a user agent: its name, made
// printable and short, for the first maxClientLabels seen, else "other".
func (m *metrics) clientLabel(ua string) string {
	if ua == "" {
		return "unknown"
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	if l, ok := m.clients[ua]; ok {
		return l
	}
	if len(m.clients) >= maxClientLabels {
		return "other"
	}
	l := strings.Map(func(r rune) rune {
		if r < 0x20 || r > 0x7e {
			return '?'
		}
		return r
	}, truncate(ua, 64))
	m.clients[ua] = l
	return l
}

// omittedCollector reports beacon_xds_omitted_endpoints by reason, read
// from the index when scraped.
type omittedCollector struct{ s *Server }

var omittedDesc = prometheus.NewDesc("beacon_xds_omitted_endpoints",
	"Instances left out of xDS (reason hostname, url, ipv6_zone, not_one_host, duplicate_address) or served with a default in place of a metadata value (invalid_weight, invalid_priority, invalid_lb_policy); the log names each.",
	[]string{"reason"}, nil)

func (c *omittedCollector) Describe(ch chan<- *prometheus.Desc) { ch <- omittedDesc }

func (c *omittedCollector) Collect(ch chan<- prometheus.Metric) {
	_, om := c.s.idx.counts()
	for _, r := range []string{reasonHostname, reasonURL, reasonIPv6Zone, reasonNotOne, reasonDuplicate, reasonWeight, reasonPriority, reasonPolicy} {
		ch <- prometheus.MustNewConstMetric(omittedDesc, prometheus.GaugeValue, float64(om[r]), r)
	}
}
