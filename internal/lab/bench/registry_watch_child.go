package bench

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"runtime/pprof"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/syncbuf"
	"github.com/beaconplane/beacon/registry"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// The watch scenario's watchers run in processes of their own, one per
// side, started as `beacon bench watch-watchers --side beacon|raw`. The
// protocol, one line each on the child's standard output:
//
//	ready                 every watcher is open (past its snapshot, or created)
//	got <s>               every watcher has sample s
//	at <s> <base> <d>...  when stdin closes: for sample s, when each watcher
//	                      (in order) had it: base + d unix nanoseconds, "-"
//	                      for a watcher that did not
//	stats <k>=<v>...      the process's garbage collection while samples came
//
// and then it exits. Its standard error is its log.

// sideRaw is the watch scenario's raw etcd side (sideBeacon its other).
const sideRaw = "raw"

// WatchChildConfig configures one watcher process of the watch scenario.
type WatchChildConfig struct {
	Side      string // "beacon" (Beacon's watchers, one shared etcd watch) or "raw" (one etcd watch each)
	Endpoints []string
	Namespace string // the samples' namespace: each side watches its own layout of it
	Watchers  int
	Samples   int
	// ProfileDir, when set, receives <side>.cpu (a CPU profile from
	// ready until stdin closes) and <side>.allocs (the allocations
	// profile at the end).
	ProfileDir string
}

// Validate checks the configuration.
func (c WatchChildConfig) Validate() error {
	if c.Side != sideBeacon && c.Side != sideRaw {
		return fmt.Errorf("bench: watch-watchers --side %q: want beacon or raw", c.Side)
	}
	if len(c.Endpoints) == 0 || c.Namespace == "" || c.Watchers <= 0 || c.Samples <= 0 {
		return fmt.Errorf("bench: watch-watchers needs --endpoints, --namespace, --watchers and --samples (got %+v)", c)
	}
	return nil
}

// arrivals records, in a watcher process, when each watcher had each
// sample (unix nanoseconds, 0: not yet), and calls complete once per
// sample when every watcher has it.
type arrivals struct {
	at       [][]int64
	pending  []atomic.Int64
	complete func(s int)
}

func newArrivals(samples, watchers int, complete func(int)) *arrivals {
	a := &arrivals{at: make([][]int64, samples), pending: make([]atomic.Int64, samples), complete: complete}
	for s := range a.at {
		a.at[s] = make([]int64, watchers)
		a.pending[s].Store(int64(watchers))
	}
	return a
}

// got records that watcher r has sample s (anything else is ignored).
func (a *arrivals) got(s, r int) {
	if s < 0 || s >= len(a.at) || a.at[s][r] != 0 {
		return
	}
	a.at[s][r] = time.Now().UnixNano()
	if a.pending[s].Add(-1) == 0 {
		a.complete(s)
	}
}

// write prints the "at" lines.
func (a *arrivals) write(w io.Writer) error {
	bw := bufio.NewWriterSize(w, 1<<20)
	var b []byte
	for s, row := range a.at {
		base := int64(0)
		for _, t := range row {
			if t != 0 && (base == 0 || t < base) {
				base = t
			}
		}
		b = append(b[:0], "at "...)
		b = strconv.AppendInt(b, int64(s), 10)
		b = append(b, ' ')
		b = strconv.AppendInt(b, base, 10)
		for _, t := range row {
			b = append(b, ' ')
			if t == 0 {
				b = append(b, '-')
			} else {
				b = strconv.AppendInt(b, t-base, 10)
			}
		}
		b = append(b, '\n')
		if _, err := bw.Write(b); err != nil {
			return err
		}
	}
	return bw.Flush()
}

// parseAt reads an "at" line's fields (after "at") into at.
func parseAt(fields []string, at [][]int64) error {
	if len(fields) < 2 {
		return fmt.Errorf("at line with %d fields", len(fields))
	}
	s, err := strconv.Atoi(fields[0])
	if err != nil || s < 0 || s >= len(at) {
		return fmt.Errorf("at line for sample %q of %d", fields[0], len(at))
	}
	base, err := strconv.ParseInt(fields[1], 10, 64)
	if err != nil {
		return fmt.Errorf("at line base %q: %w", fields[1], err)
	}
	row := make([]int64, 0, len(fields)-2)
	for _, f := range fields[2:] {
		if f == "-" {
			row = append(row, 0)
			continue
		}
		d, err := strconv.ParseInt(f, 10, 64)
		if err != nil {
			return fmt.Errorf("at line delay %q: %w", f, err)
		}
		row = append(row, base+d)
	}
	at[s] = row
	return nil
}

// RunWatchChild is a watcher process of the watch scenario (`beacon bench
// watch-watchers`): it opens cfg.Watchers watchers of its side, says
// "ready", says "got <s>" once every watcher has sample s, and when stdin
// closes (or ctx ends) closes them and reports when each had each sample.
func RunWatchChild(ctx context.Context, cfg WatchChildConfig, stdin io.Reader, stdout io.Writer) error {
	if err := cfg.Validate(); err != nil {
		return err
	}
	var mu sync.Mutex // one line at a time on stdout
	say := func(format string, args ...any) {
		mu.Lock()
		defer mu.Unlock()
		fmt.Fprintf(stdout, format+"\n", args...)
	}
	arr := newArrivals(cfg.Samples, cfg.Watchers, func(s int) { say("got %d", s) })
	wctx, cancel := context.WithCancel(ctx)
	var wg sync.WaitGroup
	closeSide, err := openSide(wctx, cfg, &wg, arr)
	if err != nil {
		cancel()
		wg.Wait()
		return err
	}
	stopProfile, err := startChildProfile(cfg)
	if err != nil {
		cancel()
		closeSide()
		wg.Wait()
		return err
	}
	var before runtime.MemStats
	runtime.ReadMemStats(&before)
	say("ready")
	eof := make(chan struct{})
	go func() { _, _ = io.Copy(io.Discard, stdin); close(eof) }()
	select {
	case <-eof:
	case <-ctx.Done():
	}
	var after runtime.MemStats
	runtime.ReadMemStats(&after)
	perr := stopProfile()
	// Closing the clients ends every watch at once (a cancelled context
	// alone left 52,000 of 100,000 raw watch channels open for over ten
	// minutes: clientv3 ends a stream's watches one at a time).
	cancel()
	closeSide()
	wg.Wait()
	mu.Lock()
	defer mu.Unlock()
	if err := arr.write(stdout); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "stats gc=%d gc_pause_ms=%.1f alloc_mb=%.1f mallocs=%d heap_mb=%.1f\n", after.NumGC-before.NumGC,
		float64(after.PauseTotalNs-before.PauseTotalNs)/1e6, float64(after.TotalAlloc-before.TotalAlloc)/1e6,
		after.Mallocs-before.Mallocs, float64(after.HeapInuse)/1e6)
	return perr
}

// openSide opens the watchers of cfg's side; end closes their clients.
func openSide(ctx context.Context, cfg WatchChildConfig, wg *sync.WaitGroup, arr *arrivals) (end func(), err error) {
	if cfg.Side == sideRaw {
		cli, err := rawClient(cfg.Endpoints)
		if err != nil {
			return nil, err
		}
		end = func() { _ = cli.Close() }
		if err := watchRaw(ctx, cli, wg, "/bench-raw"+beacon.ServicesDir+cfg.Namespace+"/w/", cfg.Watchers, arr); err != nil {
			end()
			return nil, err
		}
		return end, nil
	}
	st, err := beaconStore(ctx, cfg.Endpoints)
	if err != nil {
		return nil, err
	}
	reader, err := registry.New(st, registry.Config{Root: "/bench-beacon", WatchLinger: -1})
	if err != nil {
		_ = st.Close()
		return nil, err
	}
	end = func() { _ = reader.Close(); _ = st.Close() }
	if err := watchBeacon(ctx, reader, wg, beacon.Query{Namespace: cfg.Namespace, Component: "w"}, cfg.Watchers, arr); err != nil {
		end()
		return nil, err
	}
	return end, nil
}

// watchBeacon opens n Beacon watchers of q, each past its (empty)
// snapshot, recording in arr when each has each sample until ctx ends.
func watchBeacon(ctx context.Context, reader registry.Registry, wg *sync.WaitGroup, q beacon.Query, n int, arr *arrivals) error {
	for r := range n {
		w, err := reader.Watch(ctx, q)
		if err != nil {
			return err
		}
		if _, err := w.Next(ctx); err != nil { // the (empty) snapshot
			_ = w.Close()
			return err
		}
		wg.Go(func() {
			defer w.Close()
			for {
				b, err := w.Next(ctx)
				if err != nil {
					return
				}
				for _, e := range b.Events {
					if e.Type == beacon.Added {
						arr.got(sampleOf(e.Instance.ID), r)
					}
				}
			}
		})
	}
	return nil
}

// watchRaw opens n etcd watches of prefix on cli, recording in arr when
// each has each sample until ctx ends.
func watchRaw(ctx context.Context, cli *clientv3.Client, wg *sync.WaitGroup, prefix string, n int, arr *arrivals) error {
	for r := range n {
		wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
		select {
		case resp := <-wch:
			if !resp.Created {
				return fmt.Errorf("raw watch: unexpected first response %+v", resp)
			}
		case <-ctx.Done():
			return ctx.Err()
		}
		wg.Go(func() {
			for resp := range wch {
				for _, e := range resp.Events {
					if e.Type == clientv3.EventTypePut && e.IsCreate() {
						k := string(e.Kv.Key)
						arr.got(sampleOf(k[len(k)-beacon.IDLength:]), r)
					}
				}
			}
		})
	}
	return nil
}

// startChildProfile starts the CPU profile cfg asks for; stop ends it and
// writes the allocations profile.
func startChildProfile(cfg WatchChildConfig) (stop func() error, err error) {
	if cfg.ProfileDir == "" {
		return func() error { return nil }, nil
	}
	cpu, err := os.Create(filepath.Join(cfg.ProfileDir, cfg.Side+".cpu"))
	if err != nil {
		return nil, err
	}
	if err := pprof.StartCPUProfile(cpu); err != nil {
		_ = cpu.Close()
		return nil, err
	}
	return func() error {
		pprof.StopCPUProfile()
		allocs, err := os.Create(filepath.Join(cfg.ProfileDir, cfg.Side+".allocs"))
		if err != nil {
			return errors.Join(cpu.Close(), err)
		}
		return errors.Join(cpu.Close(), pprof.Lookup("allocs").WriteTo(allocs, 0), allocs.Close())
	}, nil
}

// watchChildArgs are what both watcher processes of a round are told.
type watchChildArgs struct {
	endpoints  []string
	namespace  string
	watchers   int
	samples    int
	profileDir string
}

// watchChild is a watcher process of the watch scenario, seen from the
// benchmark: it follows the process's output in a goroutine of its own.
type watchChild struct {
	side    string
	cmd     *exec.Cmd
	stdin   io.WriteCloser
	stderr  *syncbuf.Buffer
	ready   chan struct{}
	got     []chan struct{} // closed when every watcher has the sample
	exited  chan struct{}   // output read to its end and the process waited for
	closeIn sync.Once

	// Set by the output's reader before exited closes.
	at    [][]int64
	stats string
	err   error
}

// startWatchChild starts the watcher process of side and waits until its
// watchers are open.
func startWatchChild(ctx context.Context, log *slog.Logger, exe []string, side string, a watchChildArgs) (*watchChild, error) {
	argv := append(append([]string{}, exe...), "bench", "watch-watchers", "--side", side,
		"--endpoints", strings.Join(a.endpoints, ","), "--namespace", a.namespace,
		"--watchers", strconv.Itoa(a.watchers), "--samples", strconv.Itoa(a.samples))
	if a.profileDir != "" {
		argv = append(argv, "--profile-dir", a.profileDir)
	}
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = childAttr() // its own group, and it ends with the benchmark
	c := &watchChild{side: side, cmd: cmd, stderr: &syncbuf.Buffer{}, ready: make(chan struct{}), got: make([]chan struct{}, a.samples),
		exited: make(chan struct{}), at: make([][]int64, a.samples)}
	for s := range c.got {
		c.got[s] = make(chan struct{})
	}
	cmd.Stderr = c.stderr
	stdin, stdout, err := startPiped(cmd)
	if err != nil {
		return nil, fmt.Errorf("bench: start the %s watchers' process: %w", side, err)
	}
	c.stdin = stdin
	log.Info("started", "process", side+"-watchers", "pid", cmd.Process.Pid, "watchers", a.watchers)
	go c.read(stdout)
	select {
	case <-c.ready:
		return c, nil
	case <-c.exited:
		c.stop()
		return nil, c.exitError()
	case <-ctx.Done():
		c.stop()
		return nil, ctx.Err()
	}
}

// read follows the process's output until it ends, then waits for it.
func (c *watchChild) read(stdout io.Reader) {
	defer close(c.exited)
	br := bufio.NewReaderSize(stdout, 1<<20)
	readyOnce := sync.Once{}
	for {
		line, err := br.ReadString('\n')
		if line != "" && c.err == nil {
			c.err = c.line(strings.TrimSuffix(line, "\n"), &readyOnce)
		}
		if err != nil {
			break
		}
	}
	_ = c.cmd.Wait()
}

// line takes one line of the process's output.
func (c *watchChild) line(line string, readyOnce *sync.Once) error {
	kind, rest, _ := strings.Cut(line, " ")
	switch kind {
	case "ready":
		readyOnce.Do(func() { close(c.ready) })
	case "got":
		s, err := strconv.Atoi(rest)
		if err != nil || s < 0 || s >= len(c.got) {
			return fmt.Errorf("bench: %s watchers said %q", c.side, line)
		}
		select {
		case <-c.got[s]:
		default:
			close(c.got[s])
		}
	case "at":
		if err := parseAt(strings.Fields(rest), c.at); err != nil {
			return fmt.Errorf("bench: %s watchers: %w", c.side, err)
		}
	case "stats":
		c.stats = rest
	default:
		return fmt.Errorf("bench: %s watchers said %q", c.side, lastLines(line, 1))
	}
	return nil
}

// wait waits until every watcher has sample s: at most 30 s.
func (c *watchChild) wait(ctx context.Context, s int) error {
	select {
	case <-c.got[s]:
		return nil
	case <-time.After(30 * time.Second):
		return fmt.Errorf("bench: sample %d not received by every %s watcher within 30 s", s, c.side)
	case <-c.exited:
		return c.exitError()
	case <-ctx.Done():
		return ctx.Err()
	}
}

// exitError says that the process ended before its time, and why.
func (c *watchChild) exitError() error {
	if c.err != nil {
		return c.err
	}
	return fmt.Errorf("bench: the %s watchers' process: %w: %s", c.side, errChildExited, lastLines(c.stderr.String(), 5))
}

// finish ends the process (its watchers close) and returns when each
// watcher had each sample.
func (c *watchChild) finish(ctx context.Context) ([][]int64, error) {
	c.closeIn.Do(func() { _ = c.stdin.Close() })
	select {
	case <-c.exited:
	case <-ctx.Done():
		return nil, ctx.Err()
	}
	if c.err != nil {
		return nil, c.err
	}
	if c.cmd.ProcessState == nil || !c.cmd.ProcessState.Success() {
		return nil, fmt.Errorf("bench: the %s watchers' process failed: %s", c.side, lastLines(c.stderr.String(), 5))
	}
	return c.at, nil
}

// stop ends the process: stdin closed, SIGKILL after 10 s.
func (c *watchChild) stop() {
	c.closeIn.Do(func() { _ = c.stdin.Close() })
	select {
	case <-c.exited:
	case <-time.After(10 * time.Second):
		_ = c.cmd.Process.Kill()
		<-c.exited
	}
}

func (c *watchChild) cpu() time.Duration { return processCPU(c.cmd.Process.Pid) }

func (c *watchChild) rss() float64 { return processRSS(c.cmd.Process.Pid) }
