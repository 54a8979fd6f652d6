package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/miekg/dns"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// FindCoreDNS returns the CoreDNS that .ci/build-peers builds (with the
// etcd plugin) under $BEACON_PEERS_DIR/bin or the user cache directory's
// beacon-peers/bin, else one in PATH.
func FindCoreDNS() (string, error) {
	var dirs []string
	if d := os.Getenv("BEACON_PEERS_DIR"); d != "" {
		dirs = append(dirs, d)
	}
	if d, err := os.UserCacheDir(); err == nil {
		dirs = append(dirs, filepath.Join(d, "beacon-peers"))
	}
	for _, d := range dirs {
		p := filepath.Join(d, "bin", "coredns")
		if fi, err := os.Stat(p); err == nil && !fi.IsDir() {
			return p, nil
		}
	}
	if p, err := exec.LookPath("coredns"); err == nil {
		return p, nil
	}
	return "", errors.New("coredns not found: build it with `bash .ci/build-peers coredns` (CoreDNS 1.15 with the etcd plugin) or pass --coredns")
}

func findDNSPerf() (string, error) {
	p, err := exec.LookPath("dnsperf")
	if err != nil {
		return "", errors.New("dnsperf not found in PATH: install it with `apt-get install dnsperf` or pass --dnsperf")
	}
	return p, nil
}

// freePorts returns n loopback ports free for TCP and UDP now (picked by
// the kernel; a bench, unlike a test, can live with the small race).
func freePorts(n int) ([]int, error) {
	var ports []int
	var held []io.Closer
	defer func() {
		for _, c := range held {
			_ = c.Close()
		}
	}()
	for len(ports) < n {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		held = append(held, ln)
		p := ln.Addr().(*net.TCPAddr).Port
		pc, err := net.ListenPacket("udp", fmt.Sprintf("127.0.0.1:%d", p))
		if err != nil {
			continue // taken for UDP: try another
		}
		held = append(held, pc)
		ports = append(ports, p)
	}
	return ports, nil
}

// coreDNS is a running CoreDNS process.
type coreDNS struct {
	cmd  *exec.Cmd
	addr string
	out  *lockedBuffer
	done chan struct{}
}

// startCoreDNS runs CoreDNS answering the zone from etcd with the etcd
// plugin (no cache plugin: like Beacon, every answer reflects the store).
func startCoreDNS(ctx context.Context, bin, dir string, etcd []string, log *slog.Logger) (*coreDNS, error) {
	ports, err := freePorts(1)
	if err != nil {
		return nil, err
	}
	eps := strings.Join(etcd, " ")
	corefile := fmt.Sprintf(`%s:%d {
    bind 127.0.0.1
    etcd %s {
        path %s
        endpoint %s
    }
    errors
}
`, dnsZone, ports[0], dnsZone, skydnsRoot, eps)
	conf := filepath.Join(dir, "Corefile")
	if err := os.WriteFile(conf, []byte(corefile), 0o600); err != nil {
		return nil, err
	}
	c := &coreDNS{addr: fmt.Sprintf("127.0.0.1:%d", ports[0]), out: &lockedBuffer{}, done: make(chan struct{})}
	c.cmd = exec.Command(bin, "-conf", conf, "-quiet")
	c.cmd.Stdout, c.cmd.Stderr = c.out, c.out
	c.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	if err := c.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start coredns %s: %w", bin, err)
	}
	go func() { _ = c.cmd.Wait(); close(c.done) }()
	log.Info("coredns started", "pid", c.cmd.Process.Pid, "addr", c.addr)
	// Stop it if ctx ends while we wait for it.
	stop := context.AfterFunc(ctx, c.stop)
	defer stop()
	if err := waitDNS(ctx, c.addr, c.done); err != nil {
		c.stop()
		return nil, fmt.Errorf("coredns did not start: %w\n%s", err, c.out.String())
	}
	return c, nil
}

// waitDNS waits until addr answers DNS over TCP, or exited closes.
func waitDNS(ctx context.Context, addr string, exited <-chan struct{}) error {
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	m := new(dns.Msg)
	m.SetQuestion(dnsZone, dns.TypeSOA)
	c := &dns.Client{Net: "tcp", Timeout: time.Second}
	for {
		if _, _, err := c.ExchangeContext(ctx, m, addr); err == nil {
			return nil
		}
		select {
		case <-exited:
			return errors.New("it exited")
		case <-ctx.Done():
			return context.Cause(ctx)
		case <-time.After(50 * time.Millisecond):
		}
	}
}

// stop kills CoreDNS (its process group) and waits for it. Idempotent.
func (c *coreDNS) stop() {
	select {
	case <-c.done:
		return
	default:
	}
	_ = syscall.Kill(-c.cmd.Process.Pid, syscall.SIGKILL)
	<-c.done
}

type lockedBuffer struct {
	mu sync.Mutex
	b  strings.Builder
}

func (l *lockedBuffer) Write(p []byte) (int, error) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.b.Len() > 1<<20 {
		return len(p), nil // keep the first MiB
	}
	return l.b.Write(p)
}

func (l *lockedBuffer) String() string {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.b.String()
}

// dnsperfResult is one dnsperf run.
type dnsperfResult struct {
	qps        float64
	lost       int
	notNoError int
	latencies  []time.Duration
}

func (r dnsperfResult) percentile(p float64) time.Duration { return Percentile(r.latencies, p) }

// runDNSPerf runs dnsperf against addr for cfg.Duration, with -v so that
// every answer's latency is read (dnsperf itself prints only the mean).
func runDNSPerf(ctx context.Context, cfg DNSConfig, addr, queries string) (dnsperfResult, error) {
	host, port, _ := net.SplitHostPort(addr)
	args := []string{"-s", host, "-p", port, "-d", queries, "-l", strconv.Itoa(int(cfg.Duration / time.Second)),
		"-c", strconv.Itoa(cfg.Clients), "-q", strconv.Itoa(cfg.Outstanding), "-v"}
	cmd := exec.CommandContext(ctx, cfg.DNSPerf, args...)
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGKILL}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return dnsperfResult{}, err
	}
	var stderr lockedBuffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		return dnsperfResult{}, fmt.Errorf("start %s: %w", cfg.DNSPerf, err)
	}
	res, perr := parseDNSPerf(stdout)
	werr := cmd.Wait()
	if ctx.Err() != nil {
		return res, fmt.Errorf("interrupted: %w", context.Cause(ctx))
	}
	if err := errors.Join(perr, werr); err != nil {
		return res, fmt.Errorf("%s %s: %w\n%s", cfg.DNSPerf, strings.Join(args, " "), err, stderr.String())
	}
	if res.qps == 0 {
		return res, fmt.Errorf("%s printed no 'Queries per second'\n%s", cfg.DNSPerf, stderr.String())
	}
	return res, nil
}

// parseDNSPerf reads dnsperf -v output: one "> RCODE name type seconds"
// line per answer, "Queries lost:" and "Queries per second:" at the end.
func parseDNSPerf(r io.Reader) (dnsperfResult, error) {
	var res dnsperfResult
	sc := bufio.NewScanner(r)
	for sc.Scan() {
		line := sc.Text()
		if strings.HasPrefix(line, "> ") {
			f := strings.Fields(line)
			if len(f) < 5 {
				continue
			}
			if f[1] != "NOERROR" {
				res.notNoError++
			}
			if s, err := strconv.ParseFloat(f[len(f)-1], 64); err == nil {
				res.latencies = append(res.latencies, time.Duration(s*float64(time.Second)))
			}
			continue
		}
		line = strings.TrimSpace(line)
		if v, ok := strings.CutPrefix(line, "Queries per second:"); ok {
			res.qps, _ = strconv.ParseFloat(strings.TrimSpace(v), 64)
		}
		if v, ok := strings.CutPrefix(line, "Queries lost:"); ok {
			f := strings.Fields(v)
			if len(f) > 0 {
				res.lost, _ = strconv.Atoi(f[0])
			}
		}
	}
	return res, sc.Err()
}

func meanQPS(runs []dnsperfResult) float64 {
	if len(runs) == 0 {
		return 0
	}
	sum := 0.0
	for _, r := range runs {
		sum += r.qps
	}
	return sum / float64(len(runs))
}

func runQPS(runs []dnsperfResult) []int {
	out := make([]int, len(runs))
	for i, r := range runs {
		out[i] = int(r.qps)
	}
	return out
}

func allLatencies(runs []dnsperfResult) []time.Duration {
	var out []time.Duration
	for _, r := range runs {
		out = append(out, r.latencies...)
	}
	return out
}

// freshnessBeacon registers a new instance and measures until Beacon's DNS
// answers its name; the instance is removed afterwards.
func freshnessBeacon(ctx context.Context, reg registry.Registrar, addr string, i int) (time.Duration, error) {
	id := beacon.NewID()
	name := id + "." + dnsEndpoint + "." + dnsComponent + "." + dnsNamespace + "." + dnsZone
	start := time.Now()
	r, err := reg.Register(ctx, beacon.Instance{Namespace: dnsNamespace, Component: dnsComponent, Endpoint: dnsEndpoint,
		ID: id, Address: fmt.Sprintf("10.99.%d.%d:7000", i/256%256, i%256)})
	if err != nil {
		return 0, err
	}
	defer func() { _ = r.Close() }()
	return pollUntilAnswered(ctx, addr, name, start)
}

// freshnessCoreDNS puts a new SkyDNS key and measures until CoreDNS
// answers its name; the key is deleted afterwards.
func freshnessCoreDNS(ctx context.Context, cli *clientv3.Client, lease clientv3.LeaseID, addr string, i int) (time.Duration, error) {
	id := beacon.NewID()
	name := id + "." + dnsEndpoint + "." + dnsComponent + "." + dnsNamespace + "." + dnsZone
	in := beacon.Instance{ID: id, Address: fmt.Sprintf("10.98.%d.%d:7000", i/256%256, i%256)}
	start := time.Now()
	if err := putSkyDNS(ctx, cli, in, lease); err != nil {
		return 0, err
	}
	defer func() {
		dctx, cancel := cleanupContext(ctx, 5*time.Second)
		defer cancel()
		_, _ = cli.Delete(dctx, skydnsKey(id))
	}()
	return pollUntilAnswered(ctx, addr, name, start)
}

// pollUntilAnswered queries name (A, over UDP) back to back until it is
// answered, and returns the time since start.
func pollUntilAnswered(ctx context.Context, addr, name string, start time.Time) (time.Duration, error) {
	ctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	c := &dns.Client{Timeout: time.Second}
	m := new(dns.Msg)
	m.SetQuestion(name, dns.TypeA)
	for {
		r, _, err := c.ExchangeContext(ctx, m, addr)
		if err == nil && r.Rcode == dns.RcodeSuccess && len(r.Answer) > 0 {
			return time.Since(start), nil
		}
		if ctx.Err() != nil {
			return 0, fmt.Errorf("%s not answered within 10s: %w", name, context.Cause(ctx))
		}
	}
}

// splitHostPort reads host and port of a host:port address.
func splitHostPort(addr string) (string, int, error) {
	h, p, err := net.SplitHostPort(addr)
	if err != nil {
		return "", 0, err
	}
	port, err := strconv.Atoi(p)
	return h, port, err
}
