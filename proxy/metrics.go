package proxy

import (
	"sync"

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
	watchSilences   prometheus.Counter
	watchMoves      prometheus.Counter
	cacheHits       prometheus.Counter
	cacheMisses     *prometheus.CounterVec // reason
	kaClientStreams prometheus.Gauge
	kaUpstreams     prometheus.Gauge
	kaRequests      prometheus.Counter
	kaForwarded     prometheus.Counter
	kaSilences      prometheus.Counter

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
	const ns, sub = "beacon", "proxy"
	m := &metrics{
		requests: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "requests_total", Help: "Client RPCs handled by the proxy, by gRPC method and status code."}, []string{"method", "code"}),
		refused: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "refused_total", Help: "Write requests refused because the proxy is readonly, by method."}, []string{"method"}),
		upstreamErrors: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "upstream_failures_total", Help: "Forwarded requests that failed on an endpoint (which was then benched), by endpoint."}, []string{"endpoint"}),
		retries: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "retries_total", Help: "Read requests retried on another endpoint after a failure."}),
		loops: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "loops_detected_total", Help: "Forwarding loops detected (requests that came back to this proxy, or endpoints that are this proxy)."}),
		refreshes: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "refreshes_total", Help: "Member list refreshes, by result."}, []string{"result"}),
		endpoints: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "endpoints", Help: "Known endpoints by state: available, failed (benched), self (loop)."}, []string{"state"}),
		endpointUp: prometheus.NewGaugeVec(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "endpoint_available", Help: "1 if the endpoint is in use, 0 if benched or excluded."}, []string{"endpoint"}),
		clientWatchers: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "client_watchers", Help: "Watchers opened by clients on the proxy."}),
		clientStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "client_streams", Help: "Client gRPC streams open on the proxy (Watch, LeaseKeepAlive and other streaming calls; bounded by its MaxStreams)."}),
		shedStreams: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "shed_streams_total", Help: "Client streams that had carried no request, closed to make room for a new stream of the same client address at its MaxStreamsPerClient."}),
		upstreamWatches: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "upstream_watches", Help: "Watches the proxy holds on etcd; identical client watchers share one (the serializable cache holds one more while it is on)."}),
		watchStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "client_watch_streams", Help: "Client Watch streams open on the proxy."}),
		watchEvents: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "watch_events_total", Help: "Watch events delivered to client watchers."}),
		watchDropped: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "watch_slow_streams_total", Help: "Client watch streams ended because they did not keep up."}),
		watchSilences: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "upstream_watch_silences_total", Help: "Times an etcd member sent nothing on a watch stream, not even an answer to a progress request, within the watch silence timeout."}),
		watchMoves: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "upstream_watch_moves_total", Help: "Times the upstream watches moved to another member (the one they ran on was silent, failed or left)."}),
		cacheHits: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cache_hits_total", Help: "Serializable ranges answered from the watch-fed cache."}),
		cacheMisses: prometheus.NewCounterVec(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "cache_misses_total", Help: "Serializable ranges the cache could have answered but forwarded, by reason: stale (not confirmed within the staleness bound, or behind a write forwarded by this proxy), loading, off."}, []string{"reason"}),
		kaClientStreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "keepalive_client_streams", Help: "Client LeaseKeepAlive streams open on the proxy."}),
		kaUpstreams: prometheus.NewGauge(prometheus.GaugeOpts{Namespace: ns, Subsystem: sub,
			Name: "keepalive_upstream_streams", Help: "LeaseKeepAlive streams the proxy holds on etcd (shared by all clients)."}),
		kaRequests: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "keepalive_requests_total", Help: "Lease keep-alive requests received from clients."}),
		kaForwarded: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "keepalive_forwarded_total", Help: "Lease keep-alive requests sent to etcd (concurrent requests for one lease share one)."}),
		kaSilences: prometheus.NewCounter(prometheus.CounterOpts{Namespace: ns, Subsystem: sub,
			Name: "upstream_keepalive_silences_total", Help: "Times a keep-alive went unanswered on the upstream keep-alive stream for the keep-alive silence timeout and the stream moved to another member."}),
	}
	for _, c := range []prometheus.Collector{m.requests, m.refused, m.upstreamErrors, m.retries, m.loops,
		m.refreshes, m.endpoints, m.endpointUp, m.clientWatchers, m.clientStreams, m.shedStreams, m.upstreamWatches, m.watchStreams,
		m.watchEvents, m.watchDropped, m.watchSilences, m.watchMoves, m.cacheHits, m.cacheMisses, m.kaClientStreams, m.kaUpstreams, m.kaRequests, m.kaForwarded, m.kaSilences} {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
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
