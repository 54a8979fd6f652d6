package drill

import (
	"context"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sync"
	"text/tabwriter"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"go.etcd.io/etcd/api/v3/mvccpb"
	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"
)

// Expiry throughput: how fast etcd deletes instances whose processes died.
// etcd revokes expired leases at a fixed pace (its lessor's leaseRevokeRate,
// 1,000 leases per second, not configurable), and a revoked lease deletes
// all its keys in one revision. So what bounds the tail of a mass expiry is
// the number of leases, not of instances: Beacon's sessions hold one lease
// per process for all its instances, while one lease per instance (the
// etcd naming endpoints' habit, or one `beacon register` process per
// instance) expires at the revoke pace.

// ExpiryResult is one layout's expiry.
type ExpiryResult struct {
	Layout    string        `json:"layout"`
	Instances int           `json:"instances"`
	Leases    int           `json:"leases"`
	Revisions int           `json:"revisions"` // revisions the deletions came in
	Span      time.Duration `json:"span_ns"`   // first to last deletion
	// Tail is how long after its lease's expiry was due the last instance
	// was deleted (due: TTL after the lease's last renewal or grant, which
	// the measurement makes as the processes die).
	Tail time.Duration `json:"tail_ns"`
	// Rate is instances deleted per second over the span (0: all at once).
	Rate float64 `json:"instances_per_s"`
}

// MeasureExpiry lets instances expire in both layouts on a 1-member
// cluster of cfg.Members and measures each: Beacon's (processes sessions
// holding instances/processes each on one lease) and one lease per
// instance (raw etcd client). cfg.TTL is the lease TTL.
func MeasureExpiry(ctx context.Context, cfg Config, instances, processes int) ([]ExpiryResult, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if instances < 1 || processes < 1 || processes > instances {
		return nil, fmt.Errorf("drill: expiry of %d instances in %d processes: want 1 <= processes <= instances", instances, processes)
	}
	cfg = cfg.withDefaults()
	nw, err := cfg.Network()
	if err != nil {
		return nil, err
	}
	dir := filepath.Join(cfg.Dir, "expiry")
	if err := os.MkdirAll(dir, 0o755); err != nil {
		nw.Close()
		return nil, err
	}
	sctx, cancel := context.WithTimeout(ctx, time.Minute)
	c, err := etcdproc.StartCluster(sctx, cfg.Members, nw, 1, dir)
	cancel()
	if err != nil {
		return nil, err
	}
	defer c.Close()
	r := &runner{cfg: cfg}
	beaconRes, err := r.expireSessions(ctx, c, instances, processes)
	if err != nil {
		return nil, fmt.Errorf("expiry of Beacon sessions: %w", err)
	}
	rawRes, err := r.expireRaw(ctx, c, instances)
	if err != nil {
		return nil, fmt.Errorf("expiry of one lease per instance: %w", err)
	}
	return []ExpiryResult{beaconRes, rawRes}, nil
}

// deletions counts deletions under prefix until want were seen.
type deletions struct {
	mu    sync.Mutex
	n     int
	first time.Time
	last  time.Time
	revs  map[int64]bool
	done  chan struct{}
}

func watchDeletions(ctx context.Context, cli *clientv3.Client, prefix string, want int) (*deletions, error) {
	d := &deletions{revs: map[int64]bool{}, done: make(chan struct{})}
	wch := cli.Watch(ctx, prefix, clientv3.WithPrefix(), clientv3.WithCreatedNotify())
	created := <-wch
	if err := created.Err(); err != nil {
		return nil, err
	}
	go func() {
		for wr := range wch {
			now := time.Now()
			d.mu.Lock()
			for _, e := range wr.Events {
				if e.Type != mvccpb.DELETE {
					continue
				}
				if d.n == 0 {
					d.first = now
				}
				d.n++
				d.last = now
				d.revs[e.Kv.ModRevision] = true
			}
			full := d.n >= want
			d.mu.Unlock()
			if full {
				close(d.done)
				return
			}
		}
	}()
	return d, nil
}

func (d *deletions) result(layout string, instances, leases int, due time.Time) ExpiryResult {
	d.mu.Lock()
	defer d.mu.Unlock()
	res := ExpiryResult{Layout: layout, Instances: instances, Leases: leases, Revisions: len(d.revs),
		Span: d.last.Sub(d.first), Tail: d.last.Sub(due)}
	if res.Span > 0 {
		res.Rate = float64(instances) / res.Span.Seconds()
	}
	return res
}

func (r *runner) rawClient(c *etcdproc.Cluster) (*clientv3.Client, error) {
	return clientv3.New(clientv3.Config{Endpoints: c.Endpoints(), DialTimeout: 5 * time.Second, Logger: zap.NewNop()})
}

// expireSessions registers instances through processes sessions, then has
// every process die at once (its client closed: no revoke).
func (r *runner) expireSessions(ctx context.Context, c *etcdproc.Cluster, instances, processes int) (ExpiryResult, error) {
	ns := fmt.Sprintf("expiry-%d-s", os.Getpid()%100000)
	cli, err := r.rawClient(c)
	if err != nil {
		return ExpiryResult{}, err
	}
	defer cli.Close()
	var stores []*etcd.Store
	var regs []*registry.StoreRegistry
	defer func() {
		for _, reg := range regs {
			_ = reg.Close()
		}
		for _, st := range stores {
			_ = st.Close()
		}
	}()
	var wg sync.WaitGroup
	errs := make(chan error, processes)
	for p := range processes {
		st, err := r.openStore(ctx, c.Endpoints())
		if err != nil {
			return ExpiryResult{}, err
		}
		stores = append(stores, st)
		reg, err := registry.New(st, registry.Config{LeaseTTL: r.cfg.TTL})
		if err != nil {
			return ExpiryResult{}, err
		}
		regs = append(regs, reg)
		n := instances / processes
		if p < instances%processes {
			n++
		}
		wg.Go(func() {
			for i := range n {
				if _, err := reg.Register(ctx, beacon.Instance{Namespace: ns, Component: fmt.Sprintf("p%d", p), Endpoint: "rpc",
					Address: fmt.Sprintf("10.%d.%d.%d:7000", p%250, i/250, i%250+1), Transport: "tcp"}); err != nil {
					errs <- err
					return
				}
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return ExpiryResult{}, err
	}
	d, err := watchDeletions(ctx, cli, "/services/"+ns+"/", instances)
	if err != nil {
		return ExpiryResult{}, err
	}
	// Every process dies: its client goes, its lease is never revoked.
	// Its last keep-alive may have been up to a keep-alive interval
	// earlier, so each lease is renewed once more, here, as its process
	// dies: it is then due exactly a TTL after that renewal.
	var due time.Time
	for i, reg := range regs {
		if _, err := cli.KeepAliveOnce(ctx, clientv3.LeaseID(reg.Lease())); err != nil {
			return ExpiryResult{}, fmt.Errorf("renew lease %x: %w", reg.Lease(), err)
		}
		due = time.Now().Add(r.cfg.TTL)
		_ = stores[i].Close()
	}
	if err := d.wait(ctx, r.cfg.TTL); err != nil {
		return ExpiryResult{}, err
	}
	return d.result("beacon: one lease per process", instances, processes, due), nil
}

// expireRaw puts instances each under a lease of its own, granted and
// written as fast as the cluster takes them, then lets them expire.
func (r *runner) expireRaw(ctx context.Context, c *etcdproc.Cluster, instances int) (ExpiryResult, error) {
	prefix := fmt.Sprintf("/services/expiry-%d-r/", os.Getpid()%100000)
	cli, err := r.rawClient(c)
	if err != nil {
		return ExpiryResult{}, err
	}
	defer cli.Close()
	d, err := watchDeletions(ctx, cli, prefix, instances)
	if err != nil {
		return ExpiryResult{}, err
	}
	ttl := int64((r.cfg.TTL + time.Second - 1) / time.Second)
	const workers = 32
	var wg sync.WaitGroup
	var mu sync.Mutex
	var lastGrant time.Time
	errs := make(chan error, workers)
	for w := range workers {
		wg.Go(func() {
			for i := w; i < instances; i += workers {
				l, err := cli.Grant(ctx, ttl)
				if err != nil {
					errs <- err
					return
				}
				granted := time.Now()
				if _, err := cli.Put(ctx, fmt.Sprintf("%sk%06d", prefix, i), "x", clientv3.WithLease(l.ID)); err != nil {
					errs <- err
					return
				}
				mu.Lock()
				if granted.After(lastGrant) {
					lastGrant = granted
				}
				mu.Unlock()
			}
		})
	}
	wg.Wait()
	close(errs)
	if err := <-errs; err != nil {
		return ExpiryResult{}, err
	}
	if err := d.wait(ctx, r.cfg.TTL); err != nil {
		return ExpiryResult{}, err
	}
	return d.result("one lease per instance", instances, instances, lastGrant.Add(r.cfg.TTL)), nil
}

// wait waits until every deletion was seen, bounded by ctx and by a
// minute past the TTL.
func (d *deletions) wait(ctx context.Context, ttl time.Duration) error {
	t := time.NewTimer(ttl + time.Minute)
	defer t.Stop()
	select {
	case <-d.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	case <-t.C:
		d.mu.Lock()
		defer d.mu.Unlock()
		return fmt.Errorf("only %d deletions seen a minute after the TTL", d.n)
	}
}

// WriteExpiryTable prints expiry results.
func WriteExpiryTable(w io.Writer, results []ExpiryResult) error {
	tw := tabwriter.NewWriter(w, 0, 0, 2, ' ', 0)
	fmt.Fprintln(tw, "EXPIRY LAYOUT\tINSTANCES\tLEASES\tREVISIONS\tFIRST→LAST DELETION\tINSTANCES/S\tLAST DELETED AFTER ITS DUE TIME")
	for _, r := range results {
		rate := "all at once"
		if r.Rate > 0 {
			rate = fmt.Sprintf("%.0f", r.Rate)
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%v\t%s\t%v\n", r.Layout, r.Instances, r.Leases, r.Revisions, round(r.Span), rate, round(r.Tail))
	}
	return tw.Flush()
}
