package bench

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"runtime"
	"runtime/debug"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// residentBytes returns this process's resident memory after a garbage
// collection that gives what is free back to the operating system: what
// the process holds at rest, not the collector's slack of the moment.
func residentBytes() uint64 {
	debug.FreeOSMemory()
	return uint64(processRSS(os.Getpid()))
}

// liveHeapBytes returns the heap in use after two garbage collections.
func liveHeapBytes() uint64 {
	runtime.GC()
	runtime.GC()
	var ms runtime.MemStats
	runtime.ReadMemStats(&ms)
	return ms.HeapAlloc
}

// RunEtcdServerChild is the registry scenarios' etcd server (`beacon bench
// etcd-server`): a single-node etcd, started by the server package like
// `beacon serve`, alone in its process. It prints "endpoint <url>", then
// answers each "heap" line on stdin with "heap <bytes>" (the heap after
// GC), and stops, removing its data, when stdin closes or ctx ends
// (SIGINT, SIGTERM).
func RunEtcdServerChild(ctx context.Context, noFsync bool, stdin io.Reader, out io.Writer) error {
	srv, err := startLocalEtcd(ctx, 1, !noFsync)
	if err != nil {
		return err
	}
	defer srv.Close()
	fmt.Fprintln(out, "endpoint", srv.Endpoints()[0])
	lines := make(chan string)
	go func() { // ends with the process when stdin stays open
		defer close(lines)
		sc := bufio.NewScanner(stdin)
		for sc.Scan() {
			lines <- strings.TrimSpace(sc.Text())
		}
	}()
	for {
		select {
		case <-ctx.Done():
			return nil
		case l, ok := <-lines:
			if !ok {
				return nil
			}
			if l == "heap" {
				fmt.Fprintln(out, "heap", liveHeapBytes())
			}
		}
	}
}

// serverChild is an etcd server process started by the registry
// scenarios.
type serverChild struct {
	cmd      *exec.Cmd
	stdin    io.WriteCloser
	lines    *bufio.Scanner
	endpoint string
	done     chan struct{}
}

func startServerChild(ctx context.Context, exe []string, noFsync bool) (*serverChild, error) {
	argv := append(append([]string{}, exe...), "bench", "etcd-server")
	if noFsync {
		argv = append(argv, "--no-fsync")
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = childAttr()
	stdin, stdout, err := startPiped(cmd)
	if err != nil {
		return nil, err
	}
	c := &serverChild{cmd: cmd, stdin: stdin, lines: bufio.NewScanner(stdout), done: make(chan struct{})}
	go func() { _ = cmd.Wait(); close(c.done) }()
	ready := make(chan bool, 1)
	go func() { ready <- c.lines.Scan() }()
	select {
	case ok := <-ready:
		if !ok {
			c.stop()
			return nil, fmt.Errorf("bench: etcd server child: %w", errChildExited)
		}
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
	ep, ok := strings.CutPrefix(c.lines.Text(), "endpoint ")
	if !ok {
		c.stop()
		return nil, fmt.Errorf("bench: etcd server child printed %q", c.lines.Text())
	}
	c.endpoint = ep
	return c, nil
}

func (c *serverChild) heap() (uint64, error) {
	if _, err := fmt.Fprintln(c.stdin, "heap"); err != nil {
		return 0, err
	}
	if !c.lines.Scan() {
		return 0, fmt.Errorf("bench: etcd server child: %w", errChildExited)
	}
	v, ok := strings.CutPrefix(c.lines.Text(), "heap ")
	if !ok {
		return 0, fmt.Errorf("bench: etcd server child printed %q", c.lines.Text())
	}
	return strconv.ParseUint(v, 10, 64)
}

// stop ends the child gracefully (it removes its data) by closing its
// stdin, and kills it if it has not ended within 30 s.
func (c *serverChild) stop() {
	_ = c.stdin.Close()
	select {
	case <-c.done:
	case <-time.After(30 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.done
	}
}

// perItem is (after - before) / n, in bytes, never negative.
func perItem(before, after uint64, n int) float64 {
	if after < before || n == 0 {
		return 0
	}
	return float64(after-before) / float64(n)
}

// RunMemory measures the etcd server's heap per registered instance
// (Beacon: one lease for all; raw: a lease each), with the server alone in
// a child process, and this process's heap per watcher (Beacon: watchers
// sharing one etcd watch; raw: one etcd watch each).
func RunMemory(ctx context.Context, cfg RegistryConfig) (*Report, error) {
	cfg.defaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if err := fits(memNeed{"--mem-instances", cfg.MemInstances, costEtcdInstance, "instances in etcd"},
		memNeed{"--mem-watchers", cfg.MemWatchers, costWatcherPair, "watchers on each side"}); err != nil {
		return nil, err
	}
	if len(cfg.Endpoints) > 0 {
		return nil, fmt.Errorf("bench memory measures a server it starts itself; it does not take --endpoints")
	}
	exe, err := cfg.executable()
	if err != nil {
		return nil, err
	}
	n, m := cfg.MemInstances, cfg.MemWatchers
	if err := warmMemory(ctx, cfg, exe); err != nil {
		return nil, err
	}
	raw, err := heapPerInstance(ctx, cfg, exe, "raw", registerRawMem)
	if err != nil {
		return nil, err
	}
	bea, err := heapPerInstance(ctx, cfg, exe, "beacon", registerBeaconMem)
	if err != nil {
		return nil, err
	}
	beaconClient, rawPerWatcher, err := clientHeapPerWatcher(ctx, cfg, exe)
	if err != nil {
		return nil, err
	}
	rep := &Report{
		Scenario: "memory",
		Setup: fmt.Sprintf("embedded etcd 3.7 alone in a child process; %d instances registered per side (Beacon: one lease; raw: one lease each, same JSON values); %d watchers per side in this process",
			n, m),
	}
	rep.Add(Row{Metric: fmt.Sprintf("etcd server heap per registered instance, %d", n), Unit: "bytes", Beacon: bea.server, Baseline: raw.server, Goal: 1})
	rep.Add(Row{Metric: fmt.Sprintf("client heap per registration kept alive, %d", n), Unit: "bytes", Beacon: bea.client, Baseline: raw.client, Goal: 1})
	rep.Add(Row{Metric: fmt.Sprintf("client resident memory per registration kept alive, %d", n), Unit: "bytes", Beacon: bea.clientRSS, Baseline: raw.clientRSS, Goal: 1})
	rep.Add(Row{Metric: fmt.Sprintf("client heap per watcher, %d watchers", m), Unit: "bytes", Beacon: beaconClient, Baseline: rawPerWatcher, Goal: 1})
	rep.Note("server heap: the etcd process's heap after GC, before and after registering; client heap and resident memory: this process's (resident: after a collection that returns free memory to the OS), before and after registering (raw: each lease kept alive by clientv3's KeepAlive, as a registrant keeps it; Beacon: the registrations, which it re-registers by itself after a lost lease) and before and after opening the watchers (each has received its snapshot)")
	return rep, nil
}

// memLeaseTTL is the memory scenario's lease TTL: longer than any run.
const memLeaseTTL = time.Hour

// memRegister registers n instances with the etcd at eps, one side's way;
// release undoes what it opened.
type memRegister func(ctx context.Context, eps []string, n int) (release func(), err error)

// instanceHeap is what one registered instance costs, in bytes of heap
// after GC: in the etcd server and in the registering process; and in
// bytes of the registering process's resident memory (residentBytes).
type instanceHeap struct{ server, client, clientRSS float64 }

// warmMemory runs both sides' registrations once, small, against a server
// child of their own, before anything is measured: the code and the
// buffer pools both use are then in memory already, so that the side
// measured first is not charged for them.
func warmMemory(ctx context.Context, cfg RegistryConfig, exe []string) error {
	srv, err := startServerChild(ctx, exe, cfg.NoFsync)
	if err != nil {
		return err
	}
	defer srv.stop()
	cfg.Logger.Info("memory: warming up")
	for _, register := range []memRegister{registerRawMem, registerBeaconMem} {
		release, err := register(ctx, []string{srv.endpoint}, 200)
		if err != nil {
			return err
		}
		release()
	}
	return nil
}

// heapPerInstance is the heap a new etcd server child and this process
// grow by per instance that register registers.
func heapPerInstance(ctx context.Context, cfg RegistryConfig, exe []string, side string, register memRegister) (instanceHeap, error) {
	n := cfg.MemInstances
	srv, err := startServerChild(ctx, exe, cfg.NoFsync)
	if err != nil {
		return instanceHeap{}, err
	}
	defer srv.stop()
	before, err := srv.heap()
	if err != nil {
		return instanceHeap{}, err
	}
	clientBefore, rssBefore := liveHeapBytes(), residentBytes()
	cfg.Logger.Info("memory: registering", "side", side, "instances", n)
	release, err := register(ctx, []string{srv.endpoint}, n)
	if err != nil {
		return instanceHeap{}, err
	}
	defer release()
	clientAfter, rssAfter := liveHeapBytes(), residentBytes()
	after, err := srv.heap()
	if err != nil {
		return instanceHeap{}, err
	}
	return instanceHeap{server: perItem(before, after, n), client: perItem(clientBefore, clientAfter, n),
		clientRSS: perItem(rssBefore, rssAfter, n)}, nil
}

// registerRawMem is the raw side: a lease and a put per instance, each
// lease kept alive (clientv3's KeepAlive), as a registrant keeps it. The
// keep-alive answers are not read: with the lease's hour-long TTL the
// first one, which fits the channel's buffer, is the only one in a run.
func registerRawMem(ctx context.Context, eps []string, n int) (func(), error) {
	cli, err := rawClient(eps)
	if err != nil {
		return nil, err
	}
	kctx, stop := context.WithCancel(context.Background())
	_, _, err = run(ctx, n, 64, func(ctx context.Context, i int) error {
		in := benchInstance("mem", "raw", i)
		l, err := cli.Grant(ctx, int64(memLeaseTTL/time.Second))
		if err != nil {
			return err
		}
		if _, err := cli.Put(ctx, rawKey(in), rawValue(in), clientv3.WithLease(l.ID)); err != nil {
			return err
		}
		_, err = cli.KeepAlive(kctx, l.ID)
		return err
	})
	return func() { stop(); _ = cli.Close() }, err
}

// registerBeaconMem is Beacon's side: one registry session.
func registerBeaconMem(ctx context.Context, eps []string, n int) (func(), error) {
	st, err := beaconStore(ctx, eps)
	if err != nil {
		return nil, err
	}
	r, err := registry.New(st, registry.Config{LeaseTTL: memLeaseTTL})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	_, _, err = run(ctx, n, 64, func(ctx context.Context, i int) error {
		_, err := r.Register(ctx, benchInstance("mem", "beacon", i))
		return err
	})
	return func() { _ = r.Close(); _ = st.Close() }, err
}

// clientHeapPerWatcher is this process's heap per watcher, Beacon's and
// raw, against one more server child holding a few instances.
func clientHeapPerWatcher(ctx context.Context, cfg RegistryConfig, exe []string) (beaconPer, rawPer float64, err error) {
	srv, err := startServerChild(ctx, exe, cfg.NoFsync)
	if err != nil {
		return 0, 0, err
	}
	defer srv.stop()
	eps := []string{srv.endpoint}
	st, err := beaconStore(ctx, eps)
	if err != nil {
		return 0, 0, err
	}
	defer st.Close()
	r, err := registry.New(st, registry.Config{WatchLinger: -1})
	if err != nil {
		return 0, 0, err
	}
	defer r.Close()
	const watched = 10
	for i := range watched {
		if _, err := r.Register(ctx, benchInstance("mem", "watch", i)); err != nil {
			return 0, 0, err
		}
	}
	cfg.Logger.Info("memory: opening watchers", "side", "beacon", "watchers", cfg.MemWatchers)
	if beaconPer, err = beaconWatcherHeap(ctx, r, cfg.MemWatchers); err != nil {
		return 0, 0, err
	}
	cfg.Logger.Info("memory: opening watchers", "side", "raw", "watchers", cfg.MemWatchers)
	if rawPer, err = rawWatcherHeap(ctx, eps, cfg.MemWatchers); err != nil {
		return 0, 0, err
	}
	return beaconPer, rawPer, nil
}

// beaconWatcherHeap is the heap per watcher of m Beacon watchers of r,
// each past its snapshot.
func beaconWatcherHeap(ctx context.Context, r registry.Registry, m int) (float64, error) {
	before := liveHeapBytes()
	ws := make([]registry.Watcher, 0, m)
	defer func() {
		for _, w := range ws {
			_ = w.Close()
		}
	}()
	for range m {
		w, err := r.Watch(ctx, beacon.Query{Namespace: "mem", Component: "watch"})
		if err != nil {
			return 0, err
		}
		ws = append(ws, w)
		if _, err := w.Next(ctx); err != nil {
			return 0, err
		}
	}
	return perItem(before, liveHeapBytes(), m), nil
}

// rawWatcherHeap is the heap per watch of m raw etcd watches on one
// client.
func rawWatcherHeap(ctx context.Context, eps []string, m int) (float64, error) {
	cli, err := rawClient(eps)
	if err != nil {
		return 0, err
	}
	defer cli.Close()
	wctx, cancel := context.WithCancel(ctx)
	defer cancel()
	before := liveHeapBytes()
	chans := make([]clientv3.WatchChan, m)
	for i := range chans {
		chans[i] = cli.Watch(wctx, "/services/mem/watch/", clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		if resp := <-chans[i]; !resp.Created {
			return 0, fmt.Errorf("bench: raw watch not created: %v", resp.Err())
		}
	}
	per := perItem(before, liveHeapBytes(), m)
	runtime.KeepAlive(chans)
	return per, nil
}
