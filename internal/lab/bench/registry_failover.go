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
	cmd.Stderr = os.Stderr
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
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
	eps := strings.Join(tgt.endpoints, ",")
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()

	// Watchers first.
	st, err := beaconStore(ctx, tgt.endpoints)
	if err != nil {
		return nil, err
	}
	defer st.Close()
	reg, err := registry.New(st, registry.Config{})
	if err != nil {
		return nil, err
	}
	defer reg.Close()
	q := beacon.Query{Namespace: "bench", Component: "failover", Endpoint: "generate"}
	w, err := reg.Watch(ctx, q)
	if err != nil {
		return nil, err
	}
	defer w.Close()
	if _, err := w.Next(ctx); err != nil {
		return nil, err
	}
	cli, err := rawClient(tgt.endpoints)
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	rawPrefix := "/bench-raw/failover/"
	rawW := cli.Watch(ctx, rawPrefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	if resp := <-rawW; !resp.Created {
		return nil, fmt.Errorf("bench: raw watch not created: %v", resp.Err())
	}

	// Observations: when each instance appeared and disappeared.
	type seen struct {
		mu      sync.Mutex
		added   map[string]bool
		removed map[string]time.Time
		falseRm int
	}
	bSeen := &seen{added: map[string]bool{}, removed: map[string]time.Time{}}
	rSeen := &seen{added: map[string]bool{}, removed: map[string]time.Time{}}
	killing := make(chan struct{})
	note := func(s *seen, id string, added bool) {
		s.mu.Lock()
		defer s.mu.Unlock()
		if added {
			s.added[id] = true
			return
		}
		select {
		case <-killing:
			s.removed[id] = time.Now()
		default:
			s.falseRm++
		}
	}
	count := func(s *seen) (added, removed int) {
		s.mu.Lock()
		defer s.mu.Unlock()
		return len(s.added), len(s.removed)
	}
	var wg sync.WaitGroup
	defer wg.Wait()
	defer cancel()
	wg.Add(2)
	go func() {
		defer wg.Done()
		for {
			b, err := w.Next(ctx)
			if err != nil {
				return
			}
			for _, e := range b.Events {
				note(bSeen, e.Instance.ID, e.Type != beacon.Removed)
			}
		}
	}()
	go func() {
		defer wg.Done()
		for resp := range rawW {
			for _, e := range resp.Events {
				k := string(e.Kv.Key)
				note(rSeen, k[strings.LastIndex(k, "/")+1:], e.Type == clientv3.EventTypePut)
			}
		}
	}()

	// The registrants.
	ttl := cfg.TTL
	var beaconKids, rawKids []*registrant
	ids := make([]string, cfg.Children)
	defer func() {
		for _, k := range append(beaconKids, rawKids...) {
			k.stop()
		}
	}()
	for i := range cfg.Children {
		ids[i] = beacon.FormatID(uint64(0xfa110000 + i))
		argv := append(append([]string{}, exe...), "register", "bench/failover/generate", "--addr", fmt.Sprintf("127.0.0.1:%d", 20000+i),
			"--id", ids[i], "--ttl", ttl.String(), "--endpoints", eps, "-o", "json", "--log-level", "error")
		k, err := startRegistrant(ctx, argv, `"event":"registered"`)
		if err != nil {
			return nil, err
		}
		beaconKids = append(beaconKids, k)
		in := beacon.Instance{Namespace: "bench", Component: "failover", Endpoint: "generate", ID: ids[i], Address: fmt.Sprintf("127.0.0.1:%d", 20000+i)}
		argv = append(append([]string{}, exe...), "bench", "raw-registrant", "--endpoints", eps, "--key", rawPrefix+ids[i],
			"--value", rawValue(in), "--ttl", ttl.String())
		if k, err = startRegistrant(ctx, argv, "ready"); err != nil {
			return nil, err
		}
		rawKids = append(rawKids, k)
	}
	for _, k := range append(beaconKids, rawKids...) {
		select {
		case <-k.ready:
		case <-k.exited:
			return nil, errChildExited
		case <-time.After(60 * time.Second):
			return nil, fmt.Errorf("bench: registrant not ready within 60 s")
		}
	}
	cfg.Logger.Info("failover: registrants ready; waiting 1.5 TTL before the kill", "children", cfg.Children, "ttl", ttl)
	// Steady state: every instance seen, none removed for 1.5 TTL.
	steady := time.After(ttl * 3 / 2)
	for {
		ba, _ := count(bSeen)
		ra, _ := count(rSeen)
		if ba == cfg.Children && ra == cfg.Children {
			break
		}
		select {
		case <-steady:
			return nil, fmt.Errorf("bench: watchers saw %d Beacon and %d raw registrants of %d", ba, ra, cfg.Children)
		case <-time.After(10 * time.Millisecond):
		}
	}
	<-steady

	// Kill the children spread over one TTL, so that the kills fall at
	// every phase of their keep-alive cycles.
	close(killing)
	step := ttl / time.Duration(cfg.Children)
	next := time.Now()
	for i := range cfg.Children {
		for _, k := range []*registrant{beaconKids[i], rawKids[i]} {
			k.killed = time.Now()
			_ = k.cmd.Process.Signal(syscall.SIGKILL)
		}
		next = next.Add(step)
		time.Sleep(time.Until(next))
	}
	deadline := time.After(ttl + 15*time.Second)
	for {
		_, br := count(bSeen)
		_, rr := count(rSeen)
		if br == cfg.Children && rr == cfg.Children {
			break
		}
		select {
		case <-deadline:
			return nil, fmt.Errorf("bench: after the kill, watchers saw %d Beacon and %d raw removals of %d", br, rr, cfg.Children)
		case <-time.After(10 * time.Millisecond):
		}
	}
	lat := func(s *seen, kids []*registrant) []time.Duration {
		s.mu.Lock()
		defer s.mu.Unlock()
		out := make([]time.Duration, len(kids))
		for i, k := range kids {
			out[i] = s.removed[ids[i]].Sub(k.killed)
		}
		return out
	}
	bl, rl := lat(bSeen, beaconKids), lat(rSeen, rawKids)
	rep := &Report{
		Scenario: "failover",
		Setup: fmt.Sprintf("%s; %d `beacon register` processes vs %d raw clientv3 processes (grant, put, KeepAlive), lease TTL %v, killed with SIGKILL after 1.5 TTL, one pair every TTL/%d",
			tgt.setup, cfg.Children, cfg.Children, ttl, cfg.Children),
	}
	rep.Add(Row{Metric: "SIGKILL → removal seen, p50", Unit: "s", Beacon: Percentile(bl, 50).Seconds(), Baseline: Percentile(rl, 50).Seconds()})
	rep.Add(Row{Metric: "SIGKILL → removal seen, p99", Unit: "s", Beacon: Percentile(bl, 99).Seconds(), Baseline: Percentile(rl, 99).Seconds()})
	rep.Add(Row{Metric: "SIGKILL → removal seen, max", Unit: "s", Beacon: Percentile(bl, 100).Seconds(), Baseline: Percentile(rl, 100).Seconds()})
	rep.Add(Row{Metric: "false removals before the kill", Unit: "events", Beacon: float64(bSeen.falseRm), Baseline: float64(rSeen.falseRm)})
	verdict := "met"
	if Percentile(bl, 99) > ttl+time.Second || bSeen.falseRm > 0 {
		verdict = "MISSED"
	}
	rep.Note("goal: Beacon p99 <= TTL + 1 s = %v and no false removal: %s (Beacon p99 = TTL + %v)",
		ttl+time.Second, verdict, (Percentile(bl, 99) - ttl).Round(time.Millisecond))
	return rep, nil
}
