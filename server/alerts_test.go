package server

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"net/http"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	etcdstore "github.com/beaconplane/beacon/store/etcd"
	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"
)

// TestDocumentedAlerts reads the alert expressions of docs/operations.md
// and evaluates them against a live server's /metrics (parsed with
// Prometheus's text parser; a small evaluator does the rest, no Prometheus
// server): each must name only metrics the server exports and none may
// fire on a healthy server. It checks what the registry metrics count in
// a server (its own session idle; the HTTP API's registrations, up on
// register, down on deregister and on expiry), that the lease-unconfirmed
// alert fires for a process whose etcd went away, and that the session-lost
// alert fires for a process whose lease etcd ended and that cannot get
// another.
func TestDocumentedAlerts(t *testing.T) {
	alerts := documentedAlerts(t)
	s := startServer(t, testConfig(t))
	base := s.Endpoints().HTTP
	first := scrape(t, base)

	// Traffic, so that rates and histograms have something to show.
	reg := httpJSON(t, "POST", base+"/v1/registry/instances", `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.1:80","ttl":"30s"}`)
	var rr struct {
		Instance beacon.Instance `json:"instance"`
		Secret   string          `json:"secret"`
	}
	if err := json.Unmarshal(reg, &rr); err != nil {
		t.Fatal(err)
	}
	one := base + "/v1/registry/instances/" + rr.Instance.Ref().String()
	httpJSON(t, "POST", one+"/heartbeat", ``, "Beacon-Secret", rr.Secret)
	last := scrape(t, base)

	for _, a := range alerts {
		for _, name := range a.expr.metrics() {
			_, ok := last[name]
			for _, suffix := range []string{"_bucket", "_sum", "_count"} {
				if base, cut := strings.CutSuffix(name, suffix); cut && last[base] != nil && last[base].GetType() == dto.MetricType_HISTOGRAM {
					ok = true
				}
			}
			if !ok {
				t.Errorf("alert %q uses %s, which a server's /metrics does not export (docs/operations.md)", a.name, name)
			}
		}
		fired, v := a.expr.eval(first, last, 5*time.Minute)
		switch {
		case fired && strings.Contains(a.text, "etcd_disk_"):
			// How fast this machine's disk syncs is not the server's
			// health: report, do not fail.
			t.Logf("alert %q (%s) would fire on this machine's disk: %v", a.name, a.text, v)
		case fired:
			t.Errorf("alert %q (%s) fires on a healthy server: %v", a.name, a.text, v)
		}
	}

	// A server registers nothing itself: its session is idle, which no
	// alert takes for a problem; the HTTP registration counts as leased.
	for sel, want := range map[string]float64{
		`beacon_registry_session_state{state="idle"}`: 1,
		`beacon_registry_session_state{state="lost"}`: 0,
		`beacon_registry_registrations`:               0,
		`beacon_registry_leased_registrations`:        1,
	} {
		if got := mustSample(t, last, sel); got != want {
			t.Errorf("%s = %v, want %v", sel, got, want)
		}
	}
	httpJSON(t, "DELETE", one, "", "Beacon-Secret", rr.Secret)
	if got := mustSample(t, scrape(t, base), "beacon_registry_leased_registrations"); got != 0 {
		t.Errorf("leased registrations after deregistration: %v", got)
	}
	// A client that stops heartbeating: gone from the count once its TTL
	// ran out, as it is from the store.
	httpJSON(t, "POST", base+"/v1/registry/instances", `{"namespace":"prod","component":"api","endpoint":"http","address":"10.0.0.2:80","ttl":"2s"}`)
	if got := mustSample(t, scrape(t, base), "beacon_registry_leased_registrations"); got != 1 {
		t.Errorf("leased registrations after a second registration: %v", got)
	}
	deadline := time.Now().Add(30 * time.Second)
	for mustSample(t, scrape(t, base), "beacon_registry_leased_registrations") != 0 {
		if time.Now().After(deadline) {
			t.Fatal("an expired HTTP registration still counts")
		}
		select {
		case <-time.After(100 * time.Millisecond): // the clock is the event: the TTL
		case <-t.Context().Done():
			return
		}
	}

	// A process whose etcd went away cannot renew its lease, nor learn
	// whether etcd still holds it: unconfirmed (not lost) fires.
	t.Run("lease unconfirmed fires", func(t *testing.T) {
		srv := etcdtest.Start(t, etcdtest.Options{})
		r, promReg := sessionFor(t, etcdstore.Config{Endpoints: srv.Endpoints(), DialTimeout: time.Second, RequestTimeout: time.Second})
		unconfirmed := findAlert(t, alerts, "registry lease unconfirmed")
		before := gatherText(t, promReg)
		if fired, _ := unconfirmed.expr.eval(before, before, time.Minute); fired {
			t.Fatal("lease unconfirmed fires while the session is active")
		}
		srv.Stop()
		waitChange(t, r, "the lease was not reported unconfirmed with its etcd stopped",
			func(c registry.StateChange) bool { return errors.Is(c.Err, registry.ErrLeaseUnconfirmed) })
		after := gatherText(t, promReg)
		if fired, v := unconfirmed.expr.eval(before, after, time.Minute); !fired {
			t.Fatalf("lease unconfirmed does not fire for a process whose etcd went away: %v", v)
		}
	})
	// etcd says the lease ended and no new one can be had (the process's
	// etcd password was changed): lost fires.
	t.Run("session lost fires", func(t *testing.T) {
		srv := etcdtest.Start(t, etcdtest.Options{User: "beacon", Password: "s3cret"})
		r, promReg := sessionFor(t, etcdstore.Config{Endpoints: srv.Endpoints(), Username: "beacon", Password: "s3cret",
			DialTimeout: time.Second, RequestTimeout: time.Second})
		lost := findAlert(t, alerts, "registry session lost")
		before := gatherText(t, promReg)
		if fired, _ := lost.expr.eval(before, before, time.Minute); fired {
			t.Fatal("session lost fires while the session is active")
		}
		root := srv.Client(t)
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		if _, err := root.UserChangePassword(ctx, "beacon", "changed"); err != nil {
			t.Fatal(err)
		}
		waitChange(t, r, "the session was not lost with its credentials refused",
			func(c registry.StateChange) bool { return c.State == registry.StateLost })
		after := gatherText(t, promReg)
		if fired, v := lost.expr.eval(before, after, time.Minute); !fired {
			t.Fatalf("session lost does not fire for a process whose lease was lost: %v", v)
		}
	})
}

// sessionFor returns a registry (with its own metrics) over an etcd store
// of cfg, with one instance registered.
func sessionFor(t *testing.T, cfg etcdstore.Config) (*registry.StoreRegistry, *prometheus.Registry) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcdstore.Open(ctx, cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = st.Close() })
	promReg := prometheus.NewRegistry()
	r, err := registry.New(st, registry.Config{LeaseTTL: 2 * time.Second, Metrics: promReg})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = r.Close() })
	if _, err := r.Register(ctx, beacon.Instance{Namespace: "prod", Component: "api", Endpoint: "http", Address: "10.0.0.3:80"}); err != nil {
		t.Fatal(err)
	}
	return r, promReg
}

// waitChange reads r's state changes until ok accepts one (within a
// minute).
func waitChange(t *testing.T, r *registry.StoreRegistry, fail string, ok func(registry.StateChange) bool) {
	t.Helper()
	deadline := time.After(time.Minute)
	for {
		select {
		case c := <-r.States():
			if ok(c) {
				return
			}
		case <-deadline:
			t.Fatalf("%s (state %v)", fail, r.State())
		}
	}
}

// alert is one row of the documented alert table.
type alert struct {
	name, text string
	expr       *promExpr
}

// documentedAlerts reads the table under "### Alerts" in
// docs/operations.md.
func documentedAlerts(t *testing.T) []alert {
	t.Helper()
	b, err := os.ReadFile("../docs/operations.md")
	if err != nil {
		t.Fatal(err)
	}
	_, section, ok := strings.Cut(string(b), "### Alerts")
	if !ok {
		t.Fatal(`docs/operations.md has no "### Alerts" section`)
	}
	var out []alert
	for _, line := range strings.Split(section, "\n") {
		if strings.HasPrefix(line, "## ") {
			break
		}
		cols := strings.Split(line, "|")
		if len(cols) < 4 || !strings.HasPrefix(strings.TrimSpace(cols[2]), "`") {
			continue
		}
		name := strings.TrimSpace(cols[1])
		text := strings.Trim(strings.TrimSpace(cols[2]), "`")
		e, err := parsePromExpr(text)
		if err != nil {
			t.Fatalf("alert %q: cannot read %q: %v", name, text, err)
		}
		out = append(out, alert{name: name, text: text, expr: e})
	}
	if len(out) < 4 {
		t.Fatalf("docs/operations.md documents %d alerts", len(out))
	}
	return out
}

func findAlert(t *testing.T, alerts []alert, name string) alert {
	t.Helper()
	for _, a := range alerts {
		if a.name == name {
			return a
		}
	}
	t.Fatalf("docs/operations.md has no alert %q", name)
	return alert{}
}

// families is a scrape: metric families by name.
type families map[string]*dto.MetricFamily

func scrape(t *testing.T, base string) families {
	t.Helper()
	resp, err := http.Get(base + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(resp.Body)
	if err != nil {
		t.Fatalf("/metrics: %v", err)
	}
	return fams
}

// gatherText renders a registry in the text format and parses it back,
// as a scrape of it would.
func gatherText(t *testing.T, g prometheus.Gatherer) families {
	t.Helper()
	mfs, err := g.Gather()
	if err != nil {
		t.Fatal(err)
	}
	var buf bytes.Buffer
	enc := expfmt.NewEncoder(&buf, expfmt.NewFormat(expfmt.TypeTextPlain))
	for _, mf := range mfs {
		if err := enc.Encode(mf); err != nil {
			t.Fatal(err)
		}
	}
	p := expfmt.NewTextParser(model.UTF8Validation)
	fams, err := p.TextToMetricFamilies(&buf)
	if err != nil {
		t.Fatal(err)
	}
	return fams
}

func httpJSON(t *testing.T, method, url, body string, header ...string) []byte {
	t.Helper()
	req, _ := http.NewRequest(method, url, strings.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	for i := 0; i+1 < len(header); i += 2 {
		req.Header.Set(header[i], header[i+1])
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	var buf bytes.Buffer
	_, _ = buf.ReadFrom(resp.Body)
	if resp.StatusCode >= 300 {
		t.Fatalf("%s %s: %d %s", method, url, resp.StatusCode, buf.String())
	}
	return buf.Bytes()
}

func mustSample(t *testing.T, f families, sel string) float64 {
	t.Helper()
	e, err := parsePromExpr(sel + " >= -1e300")
	if err != nil {
		t.Fatal(err)
	}
	v := e.left.vector(f, f, 0)
	if len(v) != 1 {
		t.Fatalf("%s: %d series", sel, len(v))
	}
	for _, x := range v {
		return x
	}
	return 0
}

// promExpr is the subset of PromQL the documented alerts use:
//
//	<value> <op> <number>
//	value := selector | increase(selector[d]) | rate(selector[d]) | sum(value)
//	       | histogram_quantile(q, rate(selector_bucket[d]))
//	selector := name{label="v", label=~"re", ...}
type promExpr struct {
	left  *promValue
	op    string
	bound float64
}

type promValue struct {
	fn       string // "", increase, rate, sum, histogram_quantile
	q        float64
	name     string
	matchers []matcher
	inner    *promValue
}

type matcher struct {
	label string
	re    *regexp.Regexp // anchored
}

var (
	exprRe     = regexp.MustCompile(`^(.*?)\s*(==|!=|>=|<=|>|<)\s*(-?[0-9.e+]+)$`)
	selectorRe = regexp.MustCompile(`^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})?$`)
	matcherRe  = regexp.MustCompile(`^\s*([a-zA-Z_][a-zA-Z0-9_]*)\s*(=~|=)\s*"([^"]*)"\s*$`)
	rangeRe    = regexp.MustCompile(`^(.*)\[[0-9]+[smh]\]$`)
)

func parsePromExpr(s string) (*promExpr, error) {
	m := exprRe.FindStringSubmatch(strings.TrimSpace(s))
	if m == nil {
		return nil, fmt.Errorf("want <value> <op> <number>")
	}
	bound, err := strconv.ParseFloat(m[3], 64)
	if err != nil {
		return nil, err
	}
	v, err := parsePromValue(m[1])
	if err != nil {
		return nil, err
	}
	return &promExpr{left: v, op: m[2], bound: bound}, nil
}

func parsePromValue(s string) (*promValue, error) {
	s = strings.TrimSpace(s)
	for _, fn := range []string{"increase", "rate", "sum", "histogram_quantile"} {
		if !strings.HasPrefix(s, fn+"(") || !strings.HasSuffix(s, ")") {
			continue
		}
		arg := strings.TrimSuffix(strings.TrimPrefix(s, fn+"("), ")")
		v := &promValue{fn: fn}
		if fn == "histogram_quantile" {
			q, rest, ok := strings.Cut(arg, ",")
			if !ok {
				return nil, fmt.Errorf("histogram_quantile needs a quantile and a rate")
			}
			var err error
			if v.q, err = strconv.ParseFloat(strings.TrimSpace(q), 64); err != nil {
				return nil, err
			}
			arg = rest
		}
		if fn == "increase" || fn == "rate" {
			rm := rangeRe.FindStringSubmatch(strings.TrimSpace(arg))
			if rm == nil {
				return nil, fmt.Errorf("%s needs a range selector", fn)
			}
			arg = rm[1]
		}
		inner, err := parsePromValue(arg)
		if err != nil {
			return nil, err
		}
		v.inner = inner
		return v, nil
	}
	sm := selectorRe.FindStringSubmatch(s)
	if sm == nil {
		return nil, fmt.Errorf("%q is not a selector", s)
	}
	v := &promValue{name: sm[1]}
	if sm[2] != "" {
		for _, part := range strings.Split(sm[2], ",") {
			mm := matcherRe.FindStringSubmatch(part)
			if mm == nil {
				return nil, fmt.Errorf("matcher %q", part)
			}
			pat := regexp.QuoteMeta(mm[3])
			if mm[2] == "=~" {
				pat = mm[3]
			}
			v.matchers = append(v.matchers, matcher{label: mm[1], re: regexp.MustCompile("^(?:" + pat + ")$")})
		}
	}
	return v, nil
}

// metrics names the families the expression reads.
func (e *promExpr) metrics() []string {
	var out []string
	for v := e.left; v != nil; v = v.inner {
		if v.name != "" {
			out = append(out, v.name)
		}
	}
	return out
}

// eval evaluates the expression at the last scrape, first being the scrape
// elapsed earlier (for increase and rate). It reports whether it fires
// and the values compared.
func (e *promExpr) eval(first, last families, elapsed time.Duration) (bool, map[string]float64) {
	v := e.left.vector(first, last, elapsed)
	fired := false
	for _, x := range v {
		if math.IsNaN(x) {
			continue
		}
		switch e.op {
		case "==":
			fired = fired || x == e.bound
		case "!=":
			fired = fired || x != e.bound
		case ">":
			fired = fired || x > e.bound
		case "<":
			fired = fired || x < e.bound
		case ">=":
			fired = fired || x >= e.bound
		case "<=":
			fired = fired || x <= e.bound
		}
	}
	return fired, v
}

// vector returns the value's samples by label set.
func (v *promValue) vector(first, last families, elapsed time.Duration) map[string]float64 {
	switch v.fn {
	case "":
		return v.samples(last)
	case "increase", "rate":
		before, after := v.inner.samples(first), v.inner.samples(last)
		out := map[string]float64{}
		for k, a := range after {
			d := a - before[k] // a series born between the scrapes started at 0
			if v.fn == "rate" {
				d /= elapsed.Seconds()
			}
			out[k] = d
		}
		return out
	case "sum":
		in := v.inner.vector(first, last, elapsed)
		if len(in) == 0 {
			return nil
		}
		total := 0.0
		for _, x := range in {
			total += x
		}
		return map[string]float64{"": total}
	case "histogram_quantile":
		return quantile(v.q, v.inner.vector(first, last, elapsed))
	}
	return nil
}

// samples reads the matching series of a counter, gauge, untyped metric
// or histogram bucket (name_bucket, with an le label).
func (v *promValue) samples(f families) map[string]float64 {
	out := map[string]float64{}
	name, bucket := v.name, false
	mf, ok := f[name]
	if !ok && strings.HasSuffix(name, "_bucket") {
		mf, ok = f[strings.TrimSuffix(name, "_bucket")]
		bucket = true
	}
	if !ok {
		return out
	}
	for _, m := range mf.GetMetric() {
		labels := map[string]string{}
		for _, lp := range m.GetLabel() {
			labels[lp.GetName()] = lp.GetValue()
		}
		if !v.matches(labels) {
			continue
		}
		switch {
		case bucket && m.GetHistogram() != nil:
			for _, b := range m.GetHistogram().GetBucket() {
				l := clone(labels)
				l["le"] = strconv.FormatFloat(b.GetUpperBound(), 'g', -1, 64)
				out[key(l)] = float64(b.GetCumulativeCount())
			}
			l := clone(labels)
			l["le"] = "+Inf"
			out[key(l)] = float64(m.GetHistogram().GetSampleCount())
		case m.GetCounter() != nil:
			out[key(labels)] = m.GetCounter().GetValue()
		case m.GetGauge() != nil:
			out[key(labels)] = m.GetGauge().GetValue()
		case m.GetUntyped() != nil:
			out[key(labels)] = m.GetUntyped().GetValue()
		}
	}
	return out
}

func (v *promValue) matches(labels map[string]string) bool {
	for _, m := range v.matchers {
		if !m.re.MatchString(labels[m.label]) {
			return false
		}
	}
	return true
}

// quantile is histogram_quantile over bucket rates keyed by label sets
// that include le: linear interpolation within the bucket, as Prometheus
// does; NaN without observations.
func quantile(q float64, buckets map[string]float64) map[string]float64 {
	type bound struct{ le, count float64 }
	groups := map[string][]bound{}
	for k, c := range buckets {
		labels := parseKey(k)
		le, _ := strconv.ParseFloat(labels["le"], 64)
		if labels["le"] == "+Inf" {
			le = math.Inf(1)
		}
		delete(labels, "le")
		g := key(labels)
		groups[g] = append(groups[g], bound{le, c})
	}
	out := map[string]float64{}
	for g, bs := range groups {
		sort.Slice(bs, func(i, j int) bool { return bs[i].le < bs[j].le })
		total := bs[len(bs)-1].count
		if total <= 0 {
			out[g] = math.NaN()
			continue
		}
		rank := q * total
		prevLe, prevCount := 0.0, 0.0
		for _, b := range bs {
			if b.count >= rank {
				if math.IsInf(b.le, 1) {
					out[g] = prevLe
				} else {
					out[g] = prevLe + (b.le-prevLe)*(rank-prevCount)/(b.count-prevCount)
				}
				break
			}
			prevLe, prevCount = b.le, b.count
		}
	}
	return out
}

func clone(m map[string]string) map[string]string {
	out := make(map[string]string, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

func key(labels map[string]string) string {
	ks := make([]string, 0, len(labels))
	for k := range labels {
		ks = append(ks, k)
	}
	sort.Strings(ks)
	parts := make([]string, len(ks))
	for i, k := range ks {
		parts[i] = k + "=" + labels[k]
	}
	return strings.Join(parts, "\x00")
}

func parseKey(k string) map[string]string {
	out := map[string]string{}
	if k == "" {
		return out
	}
	for _, p := range strings.Split(k, "\x00") {
		name, val, _ := strings.Cut(p, "=")
		out[name] = val
	}
	return out
}
