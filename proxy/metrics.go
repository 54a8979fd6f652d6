package proxy

import (
	"sync"
	"sync/atomic"

	"github.com/beaconplane/beacon/internal/promreg"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"google.golang.org/grpc/status"
)

// metrics are the proxy's Prometheus series (namespace beacon_proxy).
type metrics struct {
	requests        *prometheus.CounterVec // method, code
	refused         *prometheus.CounterVec // method
	upstreamErrors  *prometheus.CounterVec // endpoint
	retries         prometheus.Counter
	loops           prometheus.Counter
	refreshes       *prometheus.CounterVec // result
	endpoints       *prometheus.GaugeVec   // state
	endpointUp      *prometheus.GaugeVec   // endpoint
	clientWatchers  prometheus.Gauge
	clientStreams   prometheus.Gauge
	shedStreams     prometheus.Counter
	upstreamWatches prometheus.Gauge
	watchStreams    prometheus.Gauge
	watchEvents     prometheus.Counter
	watchDropped    prometheus.Counter
	watchShed       prometheus.Counter
	watchSilences   prometheus.Counter
	watchMoves      prometheus.Counter
	cacheHits       prometheus.Counter
	cacheMisses     *prometheus.CounterVec // reason
	kaClientStreams prometheus.Gauge
	kaUpstreams     prometheus.Gauge
	kaRequests      prometheus.Counter
	kaForwarded     prometheus.Counter
	kaDropped       prometheus.Counter
	kaSilences      prometheus.Counter

	// watchWaiting is the bytes of the events waiting for the client
	// watch streams, each response once (watchwait.go); its gauge reads it.
	watchWaiting atomic.Int64

	reqCache sync.Map // reqKey -> prometheus.Counter
}

type reqKey struct{ method, code string }

// request counts one handled RPC.
func (m *metrics) request(method string, err error) {
	k := reqKey{method, status.Code(err).String()}
	if c, ok := m.reqCache.Load(k); ok {
		c.(prometheus.Counter).Inc()
		return
	}
	c := m.requests.WithLabelValues(k.method, k.code)
	m.reqCache.Store(k, c)
	c.Inc()
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	f := promreg.With(nil) // registered below, not shared: a second proxy on one Registerer is an error
	m := &metrics{
		requests: f.CounterVec("beacon_proxy_requests_total",
			"Client RPCs handled by the proxy, by gRPC method and status code.", "method", "code"),
		refused: f.CounterVec("beacon_proxy_refused_total",
			"Write requests refused because the proxy is readonly, by method.", "method"),
		upstreamErrors: f.CounterVec("beacon_proxy_upstream_failures_total",
			"Forwarded requests that failed on an endpoint (which was then benched), by endpoint.", "endpoint"),
		retries: f.Counter("beacon_proxy_retries_total",
			"Read requests retried on another endpoint after a failure."),
		loops: f.Counter("beacon_proxy_loops_detected_total",
			"Forwarding loops detected (requests that came back to this proxy, or endpoints that are this proxy)."),
		refreshes: f.CounterVec("beacon_proxy_refreshes_total",
			"Member list refreshes, by result.", "result"),
		endpoints: f.GaugeVec("beacon_proxy_endpoints",
			"Known endpoints by state: available, failed (benched), self (loop).", "state"),
		endpointUp: f.GaugeVec("beacon_proxy_endpoint_available",
			"1 if the endpoint is in use, 0 if benched or excluded.", "endpoint"),
		clientWatchers: f.Gauge("beacon_proxy_client_watchers",
			"Watchers opened by clients on the proxy."),
		clientStreams: f.Gauge("beacon_proxy_client_streams",
			"Client gRPC streams open on the proxy (Watch, LeaseKeepAlive and other streaming calls; bounded by its MaxStreams)."),
		shedStreams: f.Counter("beacon_proxy_shed_streams_total",
			"Client streams that had carried no request, closed to make room for a new stream of the same client address at its MaxStreamsPerClient."),
		upstreamWatches: f.Gauge("beacon_proxy_upstream_watches",
			"Watches the proxy holds on etcd; identical client watchers share one (the serializable cache holds one more while it is on)."),
		watchStreams: f.Gauge("beacon_proxy_client_watch_streams",
			"Client Watch streams open on the proxy."),
		watchEvents: f.Counter("beacon_proxy_watch_events_total",
			"Watch events delivered to client watchers."),
		watchDropped: f.Counter("beacon_proxy_watch_slow_streams_total",
			"Client watch streams ended because they did not keep up."),
		watchShed: f.Counter("beacon_proxy_watch_shed_streams_total",
			"Client watch streams ended, those that had waited longest first, because the events waiting for all streams passed MaxWatchWaitingBytes."),
		watchSilences: f.Counter("beacon_proxy_upstream_watch_silences_total",
			"Times an etcd member sent nothing on a watch stream, not even an answer to a progress request, within the watch silence timeout."),
		watchMoves: f.Counter("beacon_proxy_upstream_watch_moves_total",
			"Times the upstream watches moved to another member (the one they ran on was silent, failed or left)."),
		cacheHits: f.Counter("beacon_proxy_cache_hits_total",
			"Serializable ranges answered from the watch-fed cache."),
		cacheMisses: f.CounterVec("beacon_proxy_cache_misses_total",
			"Serializable ranges the cache could have answered but forwarded, by reason: stale (not confirmed within the staleness bound, or behind a write forwarded by this proxy), loading, off.", "reason"),
		kaClientStreams: f.Gauge("beacon_proxy_keepalive_client_streams",
			"Client LeaseKeepAlive streams open on the proxy."),
		kaUpstreams: f.Gauge("beacon_proxy_keepalive_upstream_streams",
			"LeaseKeepAlive streams the proxy holds on etcd (shared by all clients)."),
		kaRequests: f.Counter("beacon_proxy_keepalive_requests_total",
			"Lease keep-alive requests received from clients."),
		kaForwarded: f.Counter("beacon_proxy_keepalive_forwarded_total",
			"Lease keep-alive requests sent to etcd (concurrent requests for one lease share one)."),
		kaDropped: f.Counter("beacon_proxy_keepalive_slow_streams_total",
			"Client LeaseKeepAlive streams ended because they did not read their answers."),
		kaSilences: f.Counter("beacon_proxy_upstream_keepalive_silences_total",
			"Times a keep-alive went unanswered on the upstream keep-alive stream for the keep-alive silence timeout and the stream moved to another member."),
	}
	f.GaugeFunc("beacon_proxy_watch_waiting_bytes",
		"Encoded events from etcd waiting for client watch streams, each response counted once however many streams it waits for (bounded by MaxWatchWaitingBytes).",
		func() float64 { return float64(m.watchWaiting.Load()) })
	if err := promreg.RegisterEach(reg, f.Made()...); err != nil {
		return nil, err
	}
	return m, nil
}

func gaugeValue(g prometheus.Gauge) int {
	var d dto.Metric
	if err := g.Write(&d); err != nil || d.Gauge == nil {
		return 0
	}
	return int(d.Gauge.GetValue())
}
