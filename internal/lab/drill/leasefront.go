package drill

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"syscall"
	"time"

	"github.com/beaconplane/beacon/internal/lab/freeport"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// The two paths through a Beacon process in front of the cluster: HTTP
// registrations heartbeated through `beacon serve --etcd-endpoints`, and
// etcd clients keeping leases alive through `beacon proxy`.

// frontProc is a `beacon serve` or `beacon proxy` process.
type frontProc struct {
	name   string
	base   string // http://127.0.0.1:port
	cmd    *exec.Cmd
	exited chan struct{}
}

// startFront runs `beacon <args...>` with a listener on a free loopback
// port (given by addrFlag), its output to logFile, and waits until
// healthPath answers 200.
func startFront(ctx context.Context, beaconCmd func(args ...string) *exec.Cmd, name, addrFlag, healthPath, logFile string, args ...string) (*frontProc, error) {
	port, err := freeport.Port()
	if err != nil {
		return nil, err
	}
	addr := fmt.Sprintf("127.0.0.1:%d", port)
	cmd := beaconCmd(append(args, addrFlag, addr)...)
	f, err := os.Create(logFile)
	if err != nil {
		return nil, err
	}
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	if err := cmd.Start(); err != nil {
		f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &frontProc{name: name, base: "http://" + addr, cmd: cmd, exited: make(chan struct{})}
	go func() {
		defer f.Close()
		_ = cmd.Wait()
		close(p.exited)
	}()
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(time.Minute)
	for {
		select {
		case <-p.exited:
			return nil, fmt.Errorf("%s exited at start; its log: %s", name, logFile)
		default:
		}
		if resp, err := hc.Get(p.base + healthPath); err == nil {
			_, _ = io.Copy(io.Discard, resp.Body)
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return p, nil
			}
		}
		if time.Now().After(deadline) {
			p.close()
			return nil, fmt.Errorf("%s not ready within a minute; its log: %s", name, logFile)
		}
		if err := sleepCtx(ctx, 100*time.Millisecond); err != nil { // a process offers no event to wait on
			p.close()
			return nil, err
		}
	}
}

func (p *frontProc) close() {
	_ = p.cmd.Process.Kill()
	<-p.exited
}

// alive reports whether the process still runs.
func (p *frontProc) alive() bool {
	select {
	case <-p.exited:
		return false
	default:
		return true
	}
}

// httpGroup is HTTP API registrations of one TTL, each heartbeated every
// TTL/3 with a request timeout of TTL/3 and tried again at once after a
// failure, as docs/registry.md advises a client to.
type httpGroup struct {
	leaseTTL time.Duration
	st       pathStats
	srv      *frontProc
	ns, comp string
	hc       *http.Client
	ref      *reference
	ren      *renewals
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func (g *httpGroup) path() string       { return PathHTTP }
func (g *httpGroup) ttl() time.Duration { return g.leaseTTL }
func (g *httpGroup) stats() *pathStats  { return &g.st }
func (g *httpGroup) size() int          { return len(g.ren.last) }

func (g *httpGroup) settled(since time.Time) bool { return g.srv.alive() && g.ren.since(since) }

func (g *httpGroup) close() {
	g.cancel()
	g.wg.Wait()
}

// httpReg is one HTTP registration.
type httpReg struct {
	id, secret string
	at         time.Time // registered
}

func newHTTPGroup(ctx context.Context, srv *frontProc, ref *reference, ns string, ttl time.Duration, n int) (*httpGroup, error) {
	g := &httpGroup{leaseTTL: ttl, srv: srv, ns: ns, comp: fmt.Sprintf("http-%ds", int(ttl.Seconds())), ref: ref, ren: newRenewals(n),
		hc: &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: 256}}}
	rctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	for i := range n {
		reg, err := g.register(ctx, i, "")
		if err != nil {
			g.close()
			return nil, err
		}
		g.ren.ok(i, time.Now())
		g.wg.Go(func() { g.heartbeat(rctx, i, reg) })
	}
	return g, nil
}

// register registers instance i (with id when not empty).
func (g *httpGroup) register(ctx context.Context, i int, id string) (httpReg, error) {
	body, _ := json.Marshal(map[string]string{"namespace": g.ns, "component": g.comp, "endpoint": "rpc", "id": id,
		"address": fmt.Sprintf("10.72.%d.%d:7000", i/250, i%250+1), "ttl": g.leaseTTL.String()})
	rctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	req, _ := http.NewRequestWithContext(rctx, http.MethodPost, g.srv.base+"/v1/registry/instances", bytes.NewReader(body))
	req.Header.Set("Content-Type", "application/json")
	resp, err := g.hc.Do(req)
	if err != nil {
		return httpReg{}, err
	}
	defer resp.Body.Close()
	var rr struct {
		Instance struct {
			ID string `json:"id"`
		} `json:"instance"`
		Secret string `json:"secret"`
	}
	b, _ := io.ReadAll(resp.Body)
	if resp.StatusCode != http.StatusCreated && resp.StatusCode != http.StatusOK {
		return httpReg{}, fmt.Errorf("register over HTTP: %s: %s", resp.Status, strings.TrimSpace(string(b)))
	}
	if err := json.Unmarshal(b, &rr); err != nil {
		return httpReg{}, err
	}
	return httpReg{id: rr.Instance.ID, secret: rr.Secret, at: time.Now()}, nil
}

// heartbeat keeps registration i alive until ctx ends; after a 404 (the
// lease ended) it counts the loss and registers again under the same ID.
// The heartbeats that failed since the last answered one are kept for the
// loss's note: when each started, how long it took and what it got.
func (g *httpGroup) heartbeat(ctx context.Context, i int, reg httpReg) {
	every := g.leaseTTL / 3
	var failed []string
	for ctx.Err() == nil {
		start := time.Now()
		code, why := g.beat(ctx, reg, every)
		switch {
		case ctx.Err() != nil:
			return
		case code == http.StatusOK:
			g.st.gap(g.ren.ok(i, start))
			failed = failed[:0]
			_ = sleepCtx(ctx, time.Until(start.Add(every)))
		case code == http.StatusNotFound:
			g.lost(ctx, i, reg, failed)
			failed = failed[:0]
			for {
				r, err := g.register(ctx, i, reg.id)
				if err == nil {
					reg = r
					g.ren.ok(i, time.Now())
					break
				}
				if sleepCtx(ctx, 100*time.Millisecond) != nil {
					return
				}
			}
		default:
			g.st.failure()
			if len(failed) < maxFailedNoted {
				failed = append(failed, fmt.Sprintf("%s took %v: %s", start.UTC().Format(clock), round(time.Since(start)), why))
			}
			if time.Since(start) < every/2 {
				_ = sleepCtx(ctx, 50*time.Millisecond) // a fast failure: no tight loop
			}
		}
	}
}

// maxFailedNoted bounds the failed heartbeats a loss's note lists.
const maxFailedNoted = 4

// clock is how notes write a wall-clock time, to compare with the logs.
const clock = "15:04:05.000"

// beat sends one heartbeat, bounded by timeout, and returns its status (0
// when it got no answer) and, unless it is 200, what it got.
func (g *httpGroup) beat(ctx context.Context, reg httpReg, timeout time.Duration) (int, string) {
	hctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	url := fmt.Sprintf("%s/v1/registry/instances/%s/%s/rpc/%s/heartbeat", g.srv.base, g.ns, g.comp, reg.id)
	req, _ := http.NewRequestWithContext(hctx, http.MethodPost, url, nil)
	req.Header.Set("Beacon-Secret", reg.secret)
	resp, err := g.hc.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode, fmt.Sprintf("%s: %s", resp.Status, strings.TrimSpace(string(b)))
}

// lost counts registration i's loss: revoked when etcd deleted it before
// its last answered heartbeat's TTL ran out, lost otherwise (noting the
// heartbeats that failed meanwhile).
func (g *httpGroup) lost(ctx context.Context, i int, reg httpReg, failed []string) {
	last := g.ren.lastOK(i)
	key := fmt.Sprintf("/services/%s/%s/rpc/%s", g.ns, g.comp, reg.id)
	deleted := g.ref.waitDeleted(ctx, key, reg.at.Add(-time.Second), time.Second)
	g.st.mu.Lock()
	defer g.st.mu.Unlock()
	g.st.maxGap = max(g.st.maxGap, time.Since(last))
	switch {
	case !deleted.IsZero() && deleted.Before(last.Add(g.leaseTTL)):
		g.st.revoked++
	default:
		g.st.lost++
		g.st.notes = append(g.st.notes, fmt.Sprintf("HTTP registration %d (TTL %v): 404 %v after its last answered heartbeat at %s (%s); failed since: %s",
			i, g.leaseTTL, round(time.Since(last)), last.UTC().Format(clock), deletedAfter(deleted, last), noneOr(failed)))
	}
}

// proxyGroup is etcd clients (etcd's own client, each its own "process")
// keeping a lease of one TTL alive through `beacon proxy`, each with a key
// bound to it.
type proxyGroup struct {
	leaseTTL time.Duration
	st       pathStats
	px       *frontProc
	prefix   string
	ref      *reference
	ren      *renewals
	clients  []*clientv3.Client
	cancel   context.CancelFunc
	wg       sync.WaitGroup
}

func (g *proxyGroup) path() string       { return PathProxy }
func (g *proxyGroup) ttl() time.Duration { return g.leaseTTL }
func (g *proxyGroup) stats() *pathStats  { return &g.st }
func (g *proxyGroup) size() int          { return len(g.clients) }

func (g *proxyGroup) settled(since time.Time) bool { return g.px.alive() && g.ren.since(since) }

func (g *proxyGroup) close() {
	g.cancel()
	g.wg.Wait()
	for _, c := range g.clients {
		_ = c.Close()
	}
}

func newProxyGroup(ctx context.Context, px *frontProc, ref *reference, prefix string, ttl time.Duration, n int) (*proxyGroup, error) {
	g := &proxyGroup{leaseTTL: ttl, px: px, prefix: fmt.Sprintf("%sproxy-%ds/", prefix, int(ttl.Seconds())), ref: ref, ren: newRenewals(n)}
	kctx, cancel := context.WithCancel(context.Background())
	g.cancel = cancel
	for i := range n {
		cli, err := clientv3.New(clientv3.Config{Endpoints: []string{px.base}, DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
		if err != nil {
			g.close()
			return nil, err
		}
		g.clients = append(g.clients, cli)
		ka, id, err := g.grant(ctx, kctx, cli, i)
		if err != nil {
			g.close()
			return nil, err
		}
		g.wg.Go(func() { g.keep(kctx, cli, i, ka, id) })
	}
	return g, nil
}

// grant grants client i a lease, binds its key to it and starts keeping it
// alive until kctx ends.
func (g *proxyGroup) grant(ctx, kctx context.Context, cli *clientv3.Client, i int) (<-chan *clientv3.LeaseKeepAliveResponse, clientv3.LeaseID, error) {
	gctx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	l, err := cli.Grant(gctx, int64(g.leaseTTL/time.Second))
	if err != nil {
		return nil, 0, fmt.Errorf("grant through the proxy: %w", err)
	}
	if _, err := cli.Put(gctx, g.key(i, l.ID), "x", clientv3.WithLease(l.ID)); err != nil {
		return nil, 0, fmt.Errorf("put through the proxy: %w", err)
	}
	ka, err := cli.KeepAlive(kctx, l.ID)
	if err != nil {
		return nil, 0, err
	}
	g.ren.ok(i, time.Now())
	return ka, l.ID, nil
}

func (g *proxyGroup) key(i int, id clientv3.LeaseID) string {
	return fmt.Sprintf("%s%d/%x", g.prefix, i, id)
}

// keep reads client i's keep-alive answers until ctx ends; when etcd's
// client gives up (no answer within the TTL, or the lease ended) it counts
// the loss and grants a new lease.
func (g *proxyGroup) keep(ctx context.Context, cli *clientv3.Client, i int, ka <-chan *clientv3.LeaseKeepAliveResponse, id clientv3.LeaseID) {
	for {
		for range ka {
			g.st.gap(g.ren.ok(i, time.Now()))
		}
		if ctx.Err() != nil {
			return
		}
		last := g.ren.lastOK(i)
		deleted := g.ref.waitDeleted(ctx, g.key(i, id), time.Time{}, time.Second)
		g.st.mu.Lock()
		g.st.maxGap = max(g.st.maxGap, time.Since(last))
		if !deleted.IsZero() && deleted.Before(last.Add(g.leaseTTL)) {
			g.st.revoked++
		} else {
			g.st.lost++
			g.st.notes = append(g.st.notes, fmt.Sprintf("etcd client %d through the proxy (TTL %v) gave up its lease %v after the last answer (%s)",
				i, g.leaseTTL, round(time.Since(last)), deletedAfter(deleted, last)))
		}
		g.st.mu.Unlock()
		for {
			var err error
			if ka, id, err = g.grant(ctx, ctx, cli, i); err == nil {
				break
			}
			if sleepCtx(ctx, 200*time.Millisecond) != nil {
				return
			}
		}
	}
}

// deletedAfter says when etcd deleted a key, relative to last.
func deletedAfter(deleted, last time.Time) string {
	if deleted.IsZero() {
		return "etcd had not deleted it"
	}
	return fmt.Sprintf("etcd deleted it %v after that answer", round(deleted.Sub(last)))
}

// noneOr joins what failed, or says nothing did.
func noneOr(failed []string) string {
	if len(failed) == 0 {
		return "none"
	}
	return strings.Join(failed, "; ")
}
