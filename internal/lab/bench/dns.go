package bench

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/server"
	"github.com/miekg/dns"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// DNSConfig configures the DNS scenario: Beacon's DNS interface against
// CoreDNS's etcd plugin serving the same instances, as SkyDNS records, from
// the same etcd.
type DNSConfig struct {
	// EtcdEndpoints of an external etcd; empty runs an embedded one (in a
	// temporary directory, removed at the end).
	EtcdEndpoints []string
	// Instances registered (1-10000); 10 when zero.
	Instances int
	// Duration of each dnsperf run; 10 s when zero.
	Duration time.Duration
	// Rounds of alternating runs (Beacon, CoreDNS, Beacon, ...); 2 when
	// zero.
	Rounds int
	// Clients is dnsperf's -c (1-256); 4 when zero.
	Clients int
	// Outstanding is dnsperf's -q, queries in flight (1-10000); 100 when
	// zero.
	Outstanding int
	// Trials of the freshness measure (register -> first successful
	// lookup) per side; 50 when zero.
	Trials int
	// CoreDNS and DNSPerf are the programs run; found when empty (see
	// FindCoreDNS, and dnsperf in PATH).
	CoreDNS, DNSPerf string
	// Logger receives progress; nil discards it.
	Logger *slog.Logger
}

func (c DNSConfig) withDefaults() DNSConfig {
	setDefault(&c.Instances, 10)
	setDefault(&c.Duration, 10*time.Second)
	setDefault(&c.Rounds, 2)
	setDefault(&c.Clients, 4)
	setDefault(&c.Outstanding, 100)
	setDefault(&c.Trials, 50)
	setDefault(&c.Logger, discardLogger())
	return c
}

// Validate checks the settings, naming the flag of each problem.
func (c DNSConfig) Validate() error {
	var errs []error
	check := func(ok bool, format string, args ...any) {
		if !ok {
			errs = append(errs, fmt.Errorf(format, args...))
		}
	}
	check(c.Instances >= 0 && c.Instances <= 10000, "--instances %d: must be 1-10000", c.Instances)
	check(c.Duration == 0 || c.Duration >= time.Second && c.Duration <= time.Hour, "--duration %v: must be 1s-1h", c.Duration)
	check(c.Rounds >= 0 && c.Rounds <= 100, "--rounds %d: must be 1-100", c.Rounds)
	check(c.Clients >= 0 && c.Clients <= 256, "--clients %d: must be 1-256", c.Clients)
	check(c.Outstanding >= 0 && c.Outstanding <= 10000, "--outstanding %d: must be 1-10000", c.Outstanding)
	check(c.Trials >= 0 && c.Trials <= 10000, "--trials %d: must be 1-10000", c.Trials)
	for _, p := range []struct{ flag, path string }{{"--coredns", c.CoreDNS}, {"--dnsperf", c.DNSPerf}} {
		if p.path == "" {
			continue
		}
		if fi, err := os.Stat(p.path); err != nil || fi.IsDir() || fi.Mode()&0o111 == 0 {
			errs = append(errs, fmt.Errorf("%s %q: not an executable file", p.flag, p.path))
		}
	}
	return errors.Join(errs...)
}

// The names both servers answer: the zone, and where the instances live.
const (
	dnsZone       = "beacon."
	dnsNamespace  = "bench"
	dnsComponent  = "api"
	dnsEndpoint   = "web"
	skydnsRoot    = "/skydns"
	dnsBenchLease = 60 // seconds; keys vanish on their own if the run dies
)

// skydnsKey is where CoreDNS's etcd plugin reads the record of
// <id>.web.api.bench.beacon. (labels reversed under /skydns).
func skydnsKey(id string) string {
	return skydnsRoot + "/beacon/" + dnsNamespace + "/" + dnsComponent + "/" + dnsEndpoint + "/" + id
}

// RunDNS runs the scenario: it starts Beacon (embedded etcd unless
// EtcdEndpoints, and DNS) and CoreDNS with the etcd plugin over the same
// etcd, registers the instances in both forms, then alternates dnsperf runs
// against each and measures freshness. Everything it started or wrote is
// removed when it returns, also when ctx is cancelled.
func RunDNS(ctx context.Context, cfg DNSConfig) (*Report, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	if err := cfg.findPrograms(); err != nil {
		return nil, err
	}
	log := cfg.Logger
	dir, err := os.MkdirTemp("", "beacon-bench-dns-")
	if err != nil {
		return nil, err
	}
	defer func() { _ = os.RemoveAll(dir) }()

	// Beacon: the server the product runs, DNS on a free port.
	srv, err := startBenchServer(ctx, dir, cfg.EtcdEndpoints, log)
	if err != nil {
		return nil, err
	}
	defer func() { _ = srv.Close() }()
	cli := srv.EtcdClient()
	if cli == nil {
		if cli, err = clientv3.New(clientv3.Config{Endpoints: cfg.EtcdEndpoints, DialTimeout: 5 * time.Second}); err != nil {
			return nil, err
		}
		defer func() { _ = cli.Close() }()
	}
	etcdURL := srv.Endpoints().ClientURLs
	if len(etcdURL) == 0 {
		etcdURL = cfg.EtcdEndpoints
	}
	lease, release, err := skydnsLease(ctx, cli)
	if err != nil {
		return nil, err
	}
	defer release()

	core, err := startCoreDNS(ctx, cfg.CoreDNS, dir, etcdURL, log)
	if err != nil {
		return nil, err
	}
	defer core.stop()

	sides := []*dnsSide{
		{name: "beacon", addr: srv.DNSAddr()},
		{name: "coredns", addr: core.addr},
	}
	reg := srv.Registry()
	regs, err := registerBothForms(ctx, reg, cli, lease, cfg.Instances)
	defer func() {
		for _, r := range regs {
			_ = r.Close()
		}
	}()
	if err != nil {
		return nil, err
	}
	name := dnsEndpoint + "." + dnsComponent + "." + dnsNamespace + "." + dnsZone
	for _, s := range sides {
		if err := waitAnswers(ctx, s.addr, name, cfg.Instances); err != nil {
			return nil, fmt.Errorf("%s never answered %d SRV records for %s: %w", s.name, cfg.Instances, name, err)
		}
	}
	queries := filepath.Join(dir, "queries.txt")
	if err := os.WriteFile(queries, []byte(name+" A\n"+name+" SRV\n"), 0o600); err != nil {
		return nil, err
	}
	if err := measureDNSPerf(ctx, cfg, sides, queries); err != nil {
		return nil, err
	}
	if err := measureFreshness(ctx, cfg.Trials, sides, reg, cli, lease); err != nil {
		return nil, err
	}
	return dnsReport(cfg, sides), nil
}

// measureFreshness times, trials times per side, a new registration ->
// the first successful lookup of its name: through Beacon's registry
// against sides[0], as a SkyDNS record under lease against sides[1].
func measureFreshness(ctx context.Context, trials int, sides []*dnsSide, reg registry.Registrar, cli *clientv3.Client, lease clientv3.LeaseID) error {
	for i := range trials {
		b, err := freshnessBeacon(ctx, reg, sides[0].addr, i)
		if err != nil {
			return fmt.Errorf("freshness of Beacon: %w", err)
		}
		c, err := freshnessCoreDNS(ctx, cli, lease, sides[1].addr, i)
		if err != nil {
			return fmt.Errorf("freshness of CoreDNS: %w", err)
		}
		sides[0].fresh = append(sides[0].fresh, b)
		sides[1].fresh = append(sides[1].fresh, c)
	}
	return nil
}

// findPrograms finds dnsperf and CoreDNS where the configuration leaves
// them out.
func (c *DNSConfig) findPrograms() error {
	var err error
	if c.DNSPerf == "" {
		if c.DNSPerf, err = findDNSPerf(); err != nil {
			return err
		}
	}
	if c.CoreDNS == "" {
		if c.CoreDNS, err = FindCoreDNS(); err != nil {
			return err
		}
	}
	return nil
}

// skydnsLease grants the lease of the run's SkyDNS records and keeps it
// alive; release deletes the records and revokes it (the lease's TTL is
// the last resort, when the run dies).
func skydnsLease(ctx context.Context, cli *clientv3.Client) (clientv3.LeaseID, func(), error) {
	lease, err := cli.Grant(ctx, dnsBenchLease)
	if err != nil {
		return 0, nil, fmt.Errorf("etcd lease for the SkyDNS records: %w", err)
	}
	stopKeep, err := keepLeaseAlive(ctx, cli, lease.ID)
	if err != nil {
		return 0, nil, err
	}
	return lease.ID, func() {
		stopKeep()
		cctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 5*time.Second)
		defer cancel()
		_, _ = cli.Delete(cctx, skydnsRoot+"/beacon/"+dnsNamespace+"/", clientv3.WithPrefix())
		_, _ = cli.Revoke(cctx, lease.ID)
	}, nil
}

// registerBothForms registers n instances in Beacon's registry and writes
// each as a SkyDNS record under lease; the registrations made are returned
// also with an error, to be closed.
func registerBothForms(ctx context.Context, reg registry.Registry, cli *clientv3.Client, lease clientv3.LeaseID, n int) ([]registry.Registration, error) {
	regs := make([]registry.Registration, 0, n)
	for i := range n {
		in := beacon.Instance{Namespace: dnsNamespace, Component: dnsComponent, Endpoint: dnsEndpoint,
			Address: fmt.Sprintf("10.%d.%d.%d:%d", 20+i/65536, i/256%256, i%256, 8000+i%1000), Transport: "http"}
		r, err := reg.Register(ctx, in)
		if err != nil {
			return regs, fmt.Errorf("register instance %d: %w", i, err)
		}
		regs = append(regs, r)
		if err := putSkyDNS(ctx, cli, r.Instance(), lease); err != nil {
			return regs, err
		}
	}
	return regs, nil
}

// measureDNSPerf alternates dnsperf runs of queries against the sides for
// cfg.Rounds rounds.
func measureDNSPerf(ctx context.Context, cfg DNSConfig, sides []*dnsSide, queries string) error {
	for round := range cfg.Rounds {
		for _, s := range sides {
			res, err := runDNSPerf(ctx, cfg, s.addr, queries)
			if err != nil {
				return fmt.Errorf("dnsperf against %s: %w", s.name, err)
			}
			cfg.Logger.Info("dnsperf run", "side", s.name, "round", round+1, "qps", int(res.qps), "p50", res.percentile(50), "p99", res.percentile(99), "lost", res.lost)
			s.runs = append(s.runs, res)
		}
	}
	return nil
}

// dnsSide is one server measured.
type dnsSide struct {
	name  string
	addr  string
	runs  []dnsperfResult
	fresh []time.Duration
}

func dnsReport(cfg DNSConfig, sides []*dnsSide) *Report {
	b, c := sides[0], sides[1]
	r := &Report{
		Scenario:     "dns",
		BaselineName: "coredns etcd",
		Setup: fmt.Sprintf("Beacon DNS (beacon serve's registry watch) vs CoreDNS 1.15 etcd plugin (SkyDNS records, no cache plugin), same etcd, %d instances; "+
			"dnsperf -c %d -q %d, %d x %v per side, alternating; queries: A and SRV of %s.%s.%s.%s",
			cfg.Instances, cfg.Clients, cfg.Outstanding, cfg.Rounds, cfg.Duration, dnsEndpoint, dnsComponent, dnsNamespace, dnsZone),
	}
	bq, cq := meanQPS(b.runs), meanQPS(c.runs)
	r.Add(Row{Metric: "queries/s", Unit: "qps", Beacon: bq, Baseline: cq, HigherIsBetter: true, Goal: 5})
	bl, cl := allLatencies(b.runs), allLatencies(c.runs)
	r.Add(Row{Metric: "latency p50", Unit: "ms", Beacon: Ms(Percentile(bl, 50)), Baseline: Ms(Percentile(cl, 50))})
	r.Add(Row{Metric: "latency p99", Unit: "ms", Beacon: Ms(Percentile(bl, 99)), Baseline: Ms(Percentile(cl, 99)), Goal: 1})
	r.Add(Row{Metric: "freshness p50 (register -> resolvable)", Unit: "ms", Beacon: Ms(Percentile(b.fresh, 50)), Baseline: Ms(Percentile(c.fresh, 50))})
	r.Add(Row{Metric: "freshness p99", Unit: "ms", Beacon: Ms(Percentile(b.fresh, 99)), Baseline: Ms(Percentile(c.fresh, 99))})
	for _, s := range sides {
		lost, bad := 0, 0
		for _, run := range s.runs {
			lost += run.lost
			bad += run.notNoError
		}
		r.Note("%s: per-run qps %v; %d queries lost, %d answers not NOERROR", s.name, runQPS(s.runs), lost, bad)
	}
	r.Note("freshness: a new instance registered (Beacon: registry over etcd; CoreDNS: a SkyDNS key put in etcd), then its name queried in a loop until answered; %d trials per side", cfg.Trials)
	return r
}

// startBenchServer starts Beacon's server with DNS on free loopback ports:
// embedded etcd in dir, or a front over endpoints.
func startBenchServer(ctx context.Context, dir string, endpoints []string, log *slog.Logger) (*server.Server, error) {
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	cfg := server.Config{
		Name:             "bench-dns",
		DataDir:          filepath.Join(dir, "etcd"),
		ListenClientURLs: []string{fmt.Sprintf("http://127.0.0.1:%d", ports[0])},
		ListenPeerURLs:   []string{fmt.Sprintf("http://127.0.0.1:%d", ports[1])},
		HTTPAddr:         "127.0.0.1:0",
		EtcdEndpoints:    endpoints,
		DNS:              server.DNSConfig{Addr: fmt.Sprintf("127.0.0.1:%d", ports[2]), Domain: dnsZone},
		Logger:           log,
	}
	srv, err := server.New(cfg)
	if err != nil {
		return nil, err
	}
	if err := srv.Start(ctx); err != nil {
		return nil, fmt.Errorf("start beacon serve: %w", err)
	}
	return srv, nil
}

// keepLeaseAlive keeps lease alive until the returned stop is called.
func keepLeaseAlive(ctx context.Context, cli *clientv3.Client, id clientv3.LeaseID) (stop func(), err error) {
	kctx, cancel := context.WithCancel(ctx)
	ch, err := cli.KeepAlive(kctx, id)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("keep the SkyDNS lease alive: %w", err)
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		for range ch {
		}
	}()
	return func() { cancel(); <-done }, nil
}

// skydnsRecord is the SkyDNS JSON value CoreDNS's etcd plugin reads.
type skydnsRecord struct {
	Host     string `json:"host"`
	Port     int    `json:"port"`
	TTL      uint32 `json:"ttl"`
	Priority int    `json:"priority"`
	Weight   int    `json:"weight"`
}

// putSkyDNS writes the SkyDNS record of an instance, with the same host,
// port, TTL and SRV numbers Beacon answers.
func putSkyDNS(ctx context.Context, cli *clientv3.Client, in beacon.Instance, lease clientv3.LeaseID) error {
	host, port, err := splitHostPort(in.Address)
	if err != nil {
		return err
	}
	v, err := json.Marshal(skydnsRecord{Host: host, Port: port, TTL: 5, Priority: 10, Weight: 10})
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, skydnsKey(in.ID), string(v), clientv3.WithLease(lease)); err != nil {
		return fmt.Errorf("put SkyDNS record: %w", err)
	}
	return nil
}

// waitAnswers waits until addr answers n SRV records for name.
func waitAnswers(ctx context.Context, addr, name string, n int) error {
	ctx, cancel := context.WithTimeout(ctx, 30*time.Second)
	defer cancel()
	c := &dns.Client{Net: "tcp", Timeout: 2 * time.Second}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeSRV)
	var last error
	for {
		r, _, err := c.ExchangeContext(ctx, m, addr)
		switch {
		case err != nil:
			last = err
		case len(r.Answer) == n:
			return nil
		default:
			last = fmt.Errorf("%s, %d answers", dns.RcodeToString[r.Rcode], len(r.Answer))
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%w (last: %v)", context.Cause(ctx), last)
		case <-time.After(50 * time.Millisecond):
		}
	}
}
