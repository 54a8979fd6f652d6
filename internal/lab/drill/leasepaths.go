package drill

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/exec"
	"slices"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/beaconplane/beacon/store/etcd"
)

// The paths that keep a lease alive, each as a group of lease keepers of
// one TTL: in-process sessions (the Go library), `beacon register`
// processes, HTTP registrations heartbeated through a `beacon serve
// --etcd-endpoints`, and etcd clients keeping leases alive through a
// `beacon proxy`. Every keeper counts what happened to its lease in a
// pathStats.

// pathStats counts one group's lease losses, guarded by mu.
type pathStats struct {
	mu sync.Mutex
	leaseCounts
}

// leaseCounts are a group's counters.
type leaseCounts struct {
	// lost: leases that ended for want of a renewal, or that the keeper
	// gave up on (a session by its own clock, etcd's client for want of
	// an answer).
	lost int
	// revoked: leases etcd ended although they were renewed in time (a
	// resumed leader revokes those it believes expired).
	revoked int
	// falseLoss: sessions that reported their lease lost while etcd still
	// held it (recovered with the same lease).
	falseLoss int
	// unconfirmed: sessions that had no renewal answered for a whole TTL.
	unconfirmed int
	// failed: renewal attempts that failed (timed out, refused, 5xx).
	failed int
	// open: keepers whose loss (or unconfirmed lease) is not over yet.
	open int
	// maxGap: the longest time between two successful renewals (or a
	// loss) since the last reset.
	maxGap time.Duration
	notes  []string
}

// snapshot returns a copy of the counters.
func (s *pathStats) snapshot() leaseCounts {
	s.mu.Lock()
	defer s.mu.Unlock()
	c := s.leaseCounts
	c.notes = slices.Clone(c.notes)
	return c
}

func (s *pathStats) resetGap() {
	s.mu.Lock()
	s.maxGap = 0
	s.mu.Unlock()
}

func (s *pathStats) gap(d time.Duration) {
	s.mu.Lock()
	s.maxGap = max(s.maxGap, d)
	s.mu.Unlock()
}

func (s *pathStats) failure() {
	s.mu.Lock()
	s.failed++
	s.mu.Unlock()
}

// leaseGroup is one path's keepers of one TTL.
type leaseGroup interface {
	path() string
	ttl() time.Duration
	stats() *pathStats
	size() int
	// settled reports whether every keeper holds a lease and renewed it
	// after since.
	settled(since time.Time) bool
	close()
}

// renewals tracks, per keeper, the last successful renewal.
type renewals struct {
	mu   sync.Mutex
	last []time.Time
}

func newRenewals(n int) *renewals { return &renewals{last: make([]time.Time, n)} }

// ok records keeper i's renewal that started at at, and returns the gap
// since its previous one.
func (r *renewals) ok(i int, at time.Time) time.Duration {
	r.mu.Lock()
	defer r.mu.Unlock()
	gap := time.Duration(0)
	if !r.last[i].IsZero() {
		gap = at.Sub(r.last[i])
	}
	r.last[i] = at
	return gap
}

func (r *renewals) lastOK(i int) time.Time {
	r.mu.Lock()
	defer r.mu.Unlock()
	return r.last[i]
}

// since reports whether every keeper renewed after t.
func (r *renewals) since(t time.Time) bool {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, l := range r.last {
		if !l.After(t) {
			return false
		}
	}
	return true
}

// sessionEvent is one state change of a session, from the Go API or from
// `beacon register -o json`.
type sessionEvent struct {
	state       string // active, lost, recovered
	lease       string
	unconfirmed bool // no renewal answered for a whole TTL
	notFound    bool // etcd said the lease ended
	err         string
}

// sessionTracker classifies one session's losses.
type sessionTracker struct {
	who        string
	held       string // the lease before a loss
	lost       *sessionEvent
	lostUnconf bool // the loss came after an unconfirmed TTL
	unconf     bool
}

// observe counts e in st.
func (t *sessionTracker) observe(e sessionEvent, st *pathStats) {
	st.mu.Lock()
	defer st.mu.Unlock()
	switch e.state {
	case "active", "recovered":
		if e.unconfirmed && !t.unconf {
			t.unconf = true
			st.unconfirmed++
			st.open++
		} else if !e.unconfirmed && e.err == "" && t.unconf {
			t.unconf = false
			st.open--
		}
		if e.state == "recovered" && t.lost != nil {
			switch {
			case e.lease == t.held:
				st.falseLoss++
				st.notes = append(st.notes, fmt.Sprintf("%s reported lease %s lost and found etcd had kept it: %s", t.who, t.held, t.lost.err))
			case t.lost.notFound && !t.lostUnconf:
				st.revoked++
			default:
				st.lost++
				st.notes = append(st.notes, fmt.Sprintf("%s lost lease %s: %s", t.who, t.held, t.lost.err))
			}
			st.open--
			t.lost = nil
		}
		if !t.unconf && t.lost == nil {
			t.held = e.lease
		}
	case "lost":
		if t.lost != nil {
			// A report on the recovery's new lease (unconfirmed, or
			// confirmed again: same state, no error): the loss is what
			// the first event said.
			return
		}
		st.open++
		t.lostUnconf = t.unconf
		if t.unconf {
			t.unconf = false
			st.open--
		}
		t.lost = &e
	}
}

// sessionGroup is in-process registries, each with a client of its own,
// each holding one instance: the Go library's path.
type sessionGroup struct {
	leaseTTL time.Duration
	st       pathStats
	stores   []*etcd.Store
	regs     []*registry.StoreRegistry
	wg       sync.WaitGroup
}

func (g *sessionGroup) path() string       { return PathSession }
func (g *sessionGroup) ttl() time.Duration { return g.leaseTTL }
func (g *sessionGroup) stats() *pathStats  { return &g.st }
func (g *sessionGroup) size() int          { return len(g.regs) }

// newSessionGroup registers n sessions' instances, each store with the
// production defaults (only the endpoints set).
func newSessionGroup(ctx context.Context, endpoints []string, ns string, ttl time.Duration, n int, log *slog.Logger) (*sessionGroup, error) {
	g := &sessionGroup{leaseTTL: ttl}
	for i := range n {
		sctx, cancel := context.WithTimeout(ctx, 30*time.Second)
		st, err := etcd.Open(sctx, etcd.Config{Endpoints: endpoints, Logger: log.With("session", i)})
		cancel()
		if err != nil {
			g.close()
			return nil, err
		}
		g.stores = append(g.stores, st)
		reg, err := registry.New(st, registry.Config{LeaseTTL: ttl, Logger: log.With("session", i)})
		if err != nil {
			g.close()
			return nil, err
		}
		g.regs = append(g.regs, reg)
		if _, err := reg.Register(ctx, beacon.Instance{Namespace: ns, Component: fmt.Sprintf("session-%ds", int(ttl.Seconds())),
			Endpoint: "rpc", Address: fmt.Sprintf("10.70.%d.%d:7000", i/250, i%250+1)}); err != nil {
			g.close()
			return nil, fmt.Errorf("register session %d: %w", i, err)
		}
		t := &sessionTracker{who: fmt.Sprintf("session %d (TTL %v)", i, ttl)}
		g.wg.Go(func() {
			for c := range reg.States() {
				t.observe(sessionEvent{state: c.State.String(), lease: fmt.Sprintf("%x", c.Lease),
					unconfirmed: errors.Is(c.Err, registry.ErrLeaseUnconfirmed), notFound: errors.Is(c.Err, store.ErrLeaseNotFound),
					err: errString(c.Err)}, &g.st)
			}
		})
	}
	return g, nil
}

func errString(err error) string {
	if err == nil {
		return ""
	}
	return err.Error()
}

// settled: every session holds its lease, confirmed. Sessions renew on
// their own; a session renews at least once per TTL/3, so a TTL after
// since every healthy one has.
func (g *sessionGroup) settled(since time.Time) bool {
	g.st.mu.Lock()
	open := g.st.open
	g.st.mu.Unlock()
	if open > 0 || time.Since(since) < g.leaseTTL {
		return false
	}
	for _, r := range g.regs {
		if s := r.State(); s != registry.StateActive && s != registry.StateRecovered {
			return false
		}
	}
	return true
}

func (g *sessionGroup) close() {
	for _, r := range g.regs {
		_ = r.Close()
	}
	g.wg.Wait()
	for _, s := range g.stores {
		_ = s.Close()
	}
}

// registerGroup is `beacon register` processes, each holding one instance.
type registerGroup struct {
	leaseTTL time.Duration
	st       pathStats
	procs    []*registrantProc
	wg       sync.WaitGroup
}

type registrantProc struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	exited chan struct{}
	state  sessionTracker
	ready  chan struct{}
}

func (g *registerGroup) path() string       { return PathRegister }
func (g *registerGroup) ttl() time.Duration { return g.leaseTTL }
func (g *registerGroup) stats() *pathStats  { return &g.st }
func (g *registerGroup) size() int          { return len(g.procs) }

// newRegisterGroup starts n `beacon register` processes and waits until
// each registered.
func newRegisterGroup(ctx context.Context, beaconCmd func(args ...string) *exec.Cmd, endpoints []string, ns string, ttl time.Duration, n int, logDir string) (*registerGroup, error) {
	g := &registerGroup{leaseTTL: ttl}
	for i := range n {
		comp := fmt.Sprintf("register-%ds", int(ttl.Seconds()))
		cmd := beaconCmd("register", ns+"/"+comp+"/rpc", "--addr", fmt.Sprintf("10.71.%d.%d:7000", i/250, i%250+1),
			"--ttl", ttl.String(), "--endpoints", strings.Join(endpoints, ","), "-o", "json")
		p, err := g.start(cmd, fmt.Sprintf("%s/%s-%d.log", logDir, comp, i), fmt.Sprintf("beacon register %d (TTL %v)", i, ttl))
		if err != nil {
			g.close()
			return nil, err
		}
		select {
		case <-p.ready:
		case <-p.exited:
			g.close()
			return nil, fmt.Errorf("beacon register %d exited before it registered (log in %s)", i, logDir)
		case <-time.After(30 * time.Second):
			g.close()
			return nil, fmt.Errorf("beacon register %d did not register within 30 s (log in %s)", i, logDir)
		case <-ctx.Done():
			g.close()
			return nil, ctx.Err()
		}
	}
	return g, nil
}

// start runs cmd, its stderr to logFile, and follows its JSON lines.
func (g *registerGroup) start(cmd *exec.Cmd, logFile, who string) (*registrantProc, error) {
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd.Stderr = f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		f.Close()
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", who, err)
	}
	p := &registrantProc{cmd: cmd, stdin: stdin, exited: make(chan struct{}), ready: make(chan struct{}), state: sessionTracker{who: who}}
	g.procs = append(g.procs, p)
	g.wg.Go(func() {
		defer f.Close()
		_ = cmd.Wait()
		close(p.exited)
	})
	g.wg.Go(func() { g.follow(p, stdout) })
	return p, nil
}

// registerLine is what follow reads of `beacon register -o json`.
type registerLine struct {
	Event string `json:"event"`
	State string `json:"state"`
	Lease string `json:"lease"`
	Error string `json:"error"`
}

func (g *registerGroup) follow(p *registrantProc, stdout io.Reader) {
	sc := bufio.NewScanner(stdout)
	sc.Buffer(make([]byte, 64*1024), 1024*1024)
	registered := false
	for sc.Scan() {
		var l registerLine
		if json.Unmarshal(sc.Bytes(), &l) != nil {
			continue
		}
		switch l.Event {
		case "registered":
			if !registered {
				registered = true
				p.state.held = l.Lease
				close(p.ready)
			}
		case "state":
			p.state.observe(sessionEvent{state: l.State, lease: l.Lease, err: l.Error,
				unconfirmed: strings.Contains(l.Error, registry.ErrLeaseUnconfirmed.Error()),
				notFound:    strings.Contains(l.Error, store.ErrLeaseNotFound.Error())}, &g.st)
		}
	}
}

// settled: every process runs, holds its lease, confirmed, a TTL after
// since (each renews every TTL/3).
func (g *registerGroup) settled(since time.Time) bool {
	g.st.mu.Lock()
	open := g.st.open
	g.st.mu.Unlock()
	if open > 0 || time.Since(since) < g.leaseTTL {
		return false
	}
	for _, p := range g.procs {
		select {
		case <-p.exited:
			return false
		default:
		}
	}
	return true
}

func (g *registerGroup) close() {
	for _, p := range g.procs {
		_ = p.cmd.Process.Kill()
		_ = p.stdin.Close()
	}
	g.wg.Wait()
}
