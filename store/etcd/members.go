package etcd

import (
	"context"
	"errors"
	"log/slog"
	"slices"
	"sync"
	"time"

	"go.etcd.io/etcd/api/v3/v3rpc/rpctypes"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// A member that hangs (a stopped process, a stuck disk, a VM that stalls)
// still accepts TCP connections, and gRPC keeps its connection READY until
// keep-alive pings time out (15 s or more: gRPC pings at most every 10 s).
// Meanwhile the client's round-robin balancer sends it a share of every
// call, and each such call waits for its deadline. The prober shortens
// that: when a call or a watch fails for want of an answer, it probes every
// member through a client of its own, and leaves those that do not answer
// (while another one does) out of the client's endpoints, so that new calls
// and watches go to the members that answer. It probes them again every
// ProbeTimeout and puts each back as soon as it answers.

// prober tracks which members answer; one per Store made by New with
// several endpoints.
type prober struct {
	all     []string        // every configured endpoint, in order
	base    clientv3.Config // for the one-endpoint probe clients
	timeout time.Duration
	set     func(eps ...string) // sets the main client's endpoints
	log     *slog.Logger

	wake chan struct{} // a sweep is wanted

	mu      sync.Mutex
	out     map[string]time.Time // left out, since
	pending chan struct{}        // closed when the next sweep ends
	last    time.Time            // end of the last sweep
	changed chan struct{}        // closed when out changes
	clients map[string]*clientv3.Client
}

func newProber(all []string, base clientv3.Config, timeout time.Duration, set func(...string), log *slog.Logger) *prober {
	base.DialTimeout = timeout
	base.AutoSyncInterval = 0
	base.Logger = zap.NewNop() // a failed probe is the expected outcome, not news
	base.LogConfig = nil
	return &prober{
		all:     slices.Clone(all),
		base:    base,
		timeout: timeout,
		set:     set,
		log:     log,
		wake:    make(chan struct{}, 1),
		out:     make(map[string]time.Time),
		changed: make(chan struct{}),
		clients: make(map[string]*clientv3.Client),
	}
}

// suspect asks for a sweep of every member and returns a channel closed
// when it has ended. It never blocks.
func (p *prober) suspect() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.pending == nil {
		p.pending = make(chan struct{})
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return p.pending
}

// excluded returns the endpoints left out now, sorted.
func (p *prober) excluded() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	out := make([]string, 0, len(p.out))
	for ep := range p.out {
		out = append(out, ep)
	}
	slices.Sort(out)
	return out
}

// run sweeps when asked and probes the members left out every timeout,
// until stop is closed.
func (p *prober) run(stop <-chan struct{}) {
	defer p.closeClients()
	t := time.NewTicker(p.timeout)
	defer t.Stop()
	for {
		select {
		case <-stop:
			p.mu.Lock()
			if p.pending != nil {
				close(p.pending)
				p.pending = nil
			}
			p.mu.Unlock()
			return
		case <-p.wake:
			// At most one sweep per timeout: a flood of failed calls (the
			// whole cluster down) costs one probe per member per timeout.
			p.mu.Lock()
			wait := time.Until(p.last.Add(p.timeout))
			p.mu.Unlock()
			if wait > 0 {
				select {
				case <-stop:
					continue
				case <-time.After(wait):
				}
			}
			p.sweep(stop)
		case <-t.C:
			if len(p.excluded()) > 0 {
				p.recheck(stop)
			}
		}
	}
}

// sweep probes the members in use; if some answer and others do not, it
// leaves the silent ones out.
func (p *prober) sweep(stop <-chan struct{}) {
	p.mu.Lock()
	done := p.pending
	p.pending = nil
	var in []string
	for _, ep := range p.all {
		if _, ok := p.out[ep]; !ok {
			in = append(in, ep)
		}
	}
	p.mu.Unlock()
	defer func() {
		p.mu.Lock()
		p.last = time.Now()
		p.mu.Unlock()
		if done != nil {
			close(done)
		}
	}()
	ok := p.probeAll(stop, in)
	var silent []string
	answered := false
	for i, ep := range in {
		if ok[i] {
			answered = true
		} else {
			silent = append(silent, ep)
		}
	}
	if !answered || len(silent) == 0 {
		return // all answer, or none does: nothing to choose between
	}
	p.mu.Lock()
	now := time.Now()
	for _, ep := range silent {
		p.out[ep] = now
	}
	p.mu.Unlock()
	p.apply()
	p.log.Warn("etcd member does not answer; sending calls and watches to the other members until it does",
		"members", silent, "probe_timeout", p.timeout)
}

// recheck probes the members left out and puts back those that answer.
func (p *prober) recheck(stop <-chan struct{}) {
	out := p.excluded()
	ok := p.probeAll(stop, out)
	var back []string
	p.mu.Lock()
	for i, ep := range out {
		if ok[i] {
			back = append(back, ep)
			delete(p.out, ep)
		}
	}
	p.mu.Unlock()
	if len(back) == 0 {
		return
	}
	p.apply()
	p.log.Info("etcd member answers again; sending it calls again", "members", back)
}

// changes returns a channel closed at the next change of the members left
// out.
func (p *prober) changes() <-chan struct{} {
	p.mu.Lock()
	defer p.mu.Unlock()
	return p.changed
}

// apply sets the main client's endpoints to those not left out.
func (p *prober) apply() {
	p.mu.Lock()
	var in []string
	for _, ep := range p.all {
		if _, ok := p.out[ep]; !ok {
			in = append(in, ep)
		}
	}
	defer func() {
		p.mu.Lock()
		close(p.changed)
		p.changed = make(chan struct{})
		p.mu.Unlock()
	}()
	p.mu.Unlock()
	if len(in) == 0 {
		in = p.all
	}
	p.set(in...)
}

// probeAll probes eps in parallel and reports which answered.
func (p *prober) probeAll(stop <-chan struct{}, eps []string) []bool {
	ctx, cancel := context.WithTimeout(context.Background(), p.timeout)
	defer cancel()
	go func() {
		select {
		case <-stop:
			cancel()
		case <-ctx.Done():
		}
	}()
	ok := make([]bool, len(eps))
	var wg sync.WaitGroup
	for i, ep := range eps {
		wg.Go(func() { ok[i] = p.probe(ctx, ep) })
	}
	wg.Wait()
	return ok
}

// probe reads the probe key through ep alone, linearizably: a member that
// answers it can serve the store's calls (it reaches the leader).
func (p *prober) probe(ctx context.Context, ep string) bool {
	cli, err := p.client(ep)
	if err != nil {
		return false
	}
	_, err = cli.Get(ctx, probeKey, clientv3.WithCountOnly())
	return err == nil || errors.Is(err, rpctypes.ErrPermissionDenied)
}

// client returns the probe client of ep, made on first use.
func (p *prober) client(ep string) (*clientv3.Client, error) {
	p.mu.Lock()
	cli := p.clients[ep]
	p.mu.Unlock()
	if cli != nil {
		return cli, nil
	}
	cfg := p.base
	cfg.Endpoints = []string{ep}
	cli, err := clientv3.New(cfg) // authenticates, bounded by DialTimeout, when credentials are set
	if err != nil {
		return nil, err
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if other := p.clients[ep]; other != nil {
		_ = cli.Close()
		return other, nil
	}
	p.clients[ep] = cli
	return cli, nil
}

func (p *prober) closeClients() {
	p.mu.Lock()
	clients := p.clients
	p.clients = map[string]*clientv3.Client{}
	p.mu.Unlock()
	for _, cli := range clients {
		_ = cli.Close()
	}
}
