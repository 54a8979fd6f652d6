package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// RunRawRegistrant is the raw baseline's registrant process (`beacon bench
// raw-registrant`): it grants a lease, puts key with value under it, keeps
// the lease alive with the etcd client's own keep-alive loop, prints
// "ready", and runs until ctx ends or stdin closes.
func RunRawRegistrant(ctx context.Context, endpoints []string, key, value string, ttl time.Duration, stdin io.Reader, out io.Writer) error {
	cli, err := rawClient(endpoints)
	if err != nil {
		return err
	}
	defer cli.Close()
	l, err := cli.Grant(ctx, int64((ttl+time.Second-1)/time.Second))
	if err != nil {
		return err
	}
	if _, err := cli.Put(ctx, key, value, clientv3.WithLease(l.ID)); err != nil {
		return err
	}
	ka, err := cli.KeepAlive(ctx, l.ID)
	if err != nil {
		return err
	}
	go func() {
		for range ka {
		}
	}()
	fmt.Fprintln(out, "ready")
	done := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(done) }()
	select {
	case <-ctx.Done():
	case <-done:
	}
	return nil
}

// registrant is one child process of the failover scenario.
type registrant struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	ready  chan struct{}
	exited chan struct{}
	killed time.Time
}

func startRegistrant(ctx context.Context, argv []string, readyMark string) (*registrant, error) {
	cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
	cmd.SysProcAttr = childAttr()
	stdin, stdout, err := startPiped(cmd)
	if err != nil {
		return nil, err
	}
	r := &registrant{cmd: cmd, stdin: stdin, ready: make(chan struct{}), exited: make(chan struct{})}
	go func() {
		sc := bufio.NewScanner(stdout)
		seen := false
		for sc.Scan() {
			if !seen && strings.Contains(sc.Text(), readyMark) {
				seen = true
				close(r.ready)
			}
		}
		_ = cmd.Wait()
		close(r.exited)
	}()
	return r, nil
}

// startPiped starts cmd with pipes to its standard input and from its
// standard output; its standard error is this process's unless cmd has
// one.
func startPiped(cmd *exec.Cmd) (stdin io.WriteCloser, stdout io.ReadCloser, err error) {
	if cmd.Stderr == nil {
		cmd.Stderr = os.Stderr
	}
	if stdin, err = cmd.StdinPipe(); err != nil {
		return nil, nil, err
	}
	if stdout, err = cmd.StdoutPipe(); err != nil {
		return nil, nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, nil, err
	}
	return stdin, stdout, nil
}

func (r *registrant) stop() {
	_ = r.stdin.Close()
	_ = r.cmd.Process.Kill()
	<-r.exited
}

// RunFailover kills registrant processes with SIGKILL and measures when a
// watcher sees each instance removed: `beacon register` children watched
// through Beacon, against raw etcd client children (grant, put, keep-alive)
// watched with a raw etcd watch.
func RunFailover(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	exe, err := cfg.executable()
	if err != nil {
		return nil, err
	}
	tgt, err := startTarget(ctx, cfg)
	if err != nil {
		return nil, err
	}
	defer tgt.stop()
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Watchers first.
	killing := make(chan struct{})
	bSeen, rSeen := newRemovals(killing), newRemovals(killing)
	stopWatching, err := watchRemovals(ctx, tgt.endpoints, bSeen, rSeen)
	if err != nil {
		return nil, err
	}
	defer stopWatching()

	// The registrants.
	ttl := cfg.TTL
	kids := &failoverChildren{}
	defer kids.stop()
	if err := kids.start(ctx, exe, tgt.endpoints, cfg.Children, ttl); err != nil {
		return nil, err
	}
	cfg.Logger.Info("failover: registrants ready; waiting 1.5 TTL before the kill", "children", cfg.Children, "ttl", ttl)
	// Steady state: every instance seen, none removed for 1.5 TTL.
	steady := time.After(ttl * 3 / 2)
	if err := waitBoth(steady, func() (int, int) { b, _ := bSeen.count(); r, _ := rSeen.count(); return b, r }, cfg.Children,
		"bench: watchers saw %d Beacon and %d raw registrants of %d"); err != nil {
		return nil, err
	}
	<-steady

	close(killing)
	kids.kill(ttl)
	if err := waitBoth(time.After(ttl+15*time.Second), func() (int, int) { _, b := bSeen.count(); _, r := rSeen.count(); return b, r }, cfg.Children,
		"bench: after the kill, watchers saw %d Beacon and %d raw removals of %d"); err != nil {
		return nil, err
	}
	return failoverReport(cfg, tgt.setup, bSeen.latencies(kids.ids, kids.beacon), rSeen.latencies(kids.ids, kids.raw), bSeen.falseRm, rSeen.falseRm), nil
}

// rawFailoverPrefix is where the raw registrants of the failover scenario
// keep their instances.
const rawFailoverPrefix = "/bench-raw/failover/"

// failoverQuery is what the Beacon registrants of the failover scenario
// register under.
var failoverQuery = beacon.Query{Namespace: "bench", Component: "failover", Endpoint: "generate"}

// removals is what one side's watcher saw: when each instance appeared
// and disappeared; a removal before killing is closed is a false one.
type removals struct {
	killing <-chan struct{}
	mu      sync.Mutex
	added   map[string]bool
	removed map[string]time.Time
	falseRm int
}

func newRemovals(killing <-chan struct{}) *removals {
	return &removals{killing: killing, added: map[string]bool{}, removed: map[string]time.Time{}}
}

func (s *removals) note(id string, added bool) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if added {
		s.added[id] = true
		return
	}
	select {
	case <-s.killing:
		s.removed[id] = time.Now()
	default:
		s.falseRm++
	}
}

func (s *removals) count() (added, removed int) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return len(s.added), len(s.removed)
}

// latencies are, for each kid (holding the instance of the same index in
// ids), the time from its kill to the removal seen.
func (s *removals) latencies(ids []string, kids []*registrant) []time.Duration {
	s.mu.Lock()
	defer s.mu.Unlock()
	out := make([]time.Duration, len(kids))
	for i, k := range kids {
		out[i] = s.removed[ids[i]].Sub(k.killed)
	}
	return out
}

// watchRemovals opens a Beacon watch of failoverQuery and a raw etcd
// watch of rawFailoverPrefix and notes what they see in b and r until
// the returned stop is called.
func watchRemovals(ctx context.Context, eps []string, b, r *removals) (stop func(), err error) {
	var closers []func()
	stop = func() {
		for i := len(closers) - 1; i >= 0; i-- {
			closers[i]()
		}
	}
	defer func() {
		if err != nil {
			stop()
		}
	}()
	st, err := beaconStore(ctx, eps)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { st.Close() })
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { reg.Close() })
	w, err := reg.Watch(ctx, failoverQuery)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { w.Close() })
	if _, err := w.Next(ctx); err != nil {
		return nil, err
	}
	cli, err := rawClient(eps)
	if err != nil {
		return nil, err
	}
	closers = append(closers, func() { cli.Close() })
	wctx, cancel := context.WithCancel(ctx)
	rawW := cli.Watch(wctx, rawFailoverPrefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if resp := <-rawW; !resp.Created {
		cancel()
		return nil, fmt.Errorf("bench: raw watch not created: %v", resp.Err())
	}
	var wg sync.WaitGroup
	closers = append(closers, func() { cancel(); wg.Wait() })
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			bt, err := w.Next(wctx)
			if err != nil {
				return
			}
			for _, e := range bt.Events {
				b.note(e.Instance.ID, e.Type != beacon.Removed)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for resp := range rawW {
			for _, e := range resp.Events {
				k := string(e.Kv.Key)
				r.note(k[strings.LastIndex(k, "/")+1:], e.Type == clientv3.EventTypePut)
			}
		}
	}()
	return stop, nil
}

// waitBoth polls counts until both reach n, or fails with msg (formatted
// with both counts and n) when deadline fires.
func waitBoth(deadline <-chan time.Time, counts func() (int, int), n int, msg string) error {
	for {
		b, r := counts()
		if b == n && r == n {
			return nil
		}
		select {
		case <-deadline:
			return fmt.Errorf(msg, b, r, n)
		case <-time.After(10 * time.Millisecond):
		}
	}
}

// failoverChildren are the registrant processes of the failover scenario:
// beacon[i] and raw[i] hold the instance ids[i].
type failoverChildren struct {
	ids         []string
	beacon, raw []*registrant
}

// start starts n registrants per side and waits until all are ready.
func (c *failoverChildren) start(ctx context.Context, exe, endpoints []string, n int, ttl time.Duration) error {
	eps := strings.Join(endpoints, ",")
	for i := range n {
		id := beacon.FormatID(uint64(0xfa110000 + i))
		c.ids = append(c.ids, id)
		in := beacon.Instance{Namespace: failoverQuery.Namespace, Component: failoverQuery.Component, Endpoint: failoverQuery.Endpoint,
			ID: id, Address: fmt.Sprintf("127.0.0.1:%d", 20000+i)}
		argv := append(append([]string{}, exe...), "register", failoverQuery.String(), "--addr", in.Address,
			"--id", id, "--ttl", ttl.String(), "--endpoints", eps, "-o", "json", "--log-level", "error")
		k, err := startRegistrant(ctx, argv, `"event":"registered"`)
		if err != nil {
			return err
		}
		c.beacon = append(c.beacon, k)
		argv = append(append([]string{}, exe...), "bench", "raw-registrant", "--endpoints", eps, "--key", rawFailoverPrefix+id,
			"--value", rawValue(in), "--ttl", ttl.String())
		if k, err = startRegistrant(ctx, argv, "ready"); err != nil {
			return err
		}
		c.raw = append(c.raw, k)
	}
	for _, k := range append(c.beacon, c.raw...) {
		select {
		case <-k.ready:
		case <-k.exited:
			return errChildExited
		case <-time.After(60 * time.Second):
			return fmt.Errorf("bench: registrant not ready within 60 s")
		}
	}
	return nil
}

// kill kills the children with SIGKILL, a pair at a time, spread over one
// TTL, so that the kills fall at every phase of their keep-alive cycles.
func (c *failoverChildren) kill(ttl time.Duration) {
	step := ttl / time.Duration(len(c.ids))
	next := time.Now()
	for i := range c.ids {
		for _, k := range []*registrant{c.beacon[i], c.raw[i]} {
			k.killed = time.Now()
			_ = k.cmd.Process.Signal(syscall.SIGKILL)
		}
		next = next.Add(step)
		time.Sleep(time.Until(next))
	}
}

func (c *failoverChildren) stop() {
	for _, k := range append(c.beacon, c.raw...) {
		k.stop()
	}
}

// failoverReport reports the latencies of removals seen after the kills
// (bl: Beacon's, rl: raw) and the false removals before them.
func failoverReport(cfg RegistryConfig, setup string, bl, rl []time.Duration, bFalse, rFalse int) *Report {
	ttl := cfg.TTL
	rep := &Report{
		Scenario: "failover",
		Setup: fmt.Sprintf("%s; %d `beacon register` processes vs %d raw clientv3 processes (grant, put, KeepAlive), lease TTL %v, killed with SIGKILL after 1.5 TTL, one pair every TTL/%d",
			setup, cfg.Children, cfg.Children, ttl, cfg.Children),
	}
	rep.Add(Row{Metric: "SIGKILL → removal seen, p50", Unit: "s", Beacon: Percentile(bl, 50).Seconds(), Baseline: Percentile(rl, 50).Seconds()})
	rep.Add(Row{Metric: "SIGKILL → removal seen, p99", Unit: "s", Beacon: Percentile(bl, 99).Seconds(), Baseline: Percentile(rl, 99).Seconds()})
	rep.Add(Row{Metric: "SIGKILL → removal seen, max", Unit: "s", Beacon: Percentile(bl, 100).Seconds(), Baseline: Percentile(rl, 100).Seconds()})
	rep.Add(Row{Metric: "false removals before the kill", Unit: "events", Beacon: float64(bFalse), Baseline: float64(rFalse)})
	verdict := "met"
	if Percentile(bl, 99) > ttl+time.Second || bFalse > 0 {
		verdict = "MISSED"
	}
	rep.Note("goal: Beacon p99 <= TTL + 1 s = %v and no false removal: %s (Beacon p99 = TTL + %v)",
		ttl+time.Second, verdict, (Percentile(bl, 99) - ttl).Round(time.Millisecond))
	return rep
}
