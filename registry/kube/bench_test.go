package kube_test

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/lab/bench"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	corev1 "k8s.io/api/core/v1"
)

// The Kubernetes registry beside the etcd one, in the same run, on the same
// machine: the time from Register until every watcher has the instance, and
// from the removal (deregistration; on Kubernetes also the pod turning
// NotReady) until every watcher has seen it go. Each iteration takes one
// sample of each backend, alternating, so both see the same load. The
// etcd side is Beacon's StoreRegistry over an embedded etcd 3.7; the
// Kubernetes side writes InstanceSets through a real kube-apiserver (whose
// own etcd is another embedded etcd 3.7) and reads them with the
// EndpointSlices the real controller maintains. Watchers are in one reader
// process, sharing its watch, as a frontend's would.
//
//	go test ./registry/kube -run XXX -bench KubernetesVsEtcd -benchtime 100x
//
// Metrics: <backend>-<event>-p50-ms and -p99-ms, and the ratios
// kube/etcd (x-p50, x-p99).
func BenchmarkKubernetesVsEtcd(b *testing.B) {
	for _, n := range []int{1, 100} {
		b.Run(fmt.Sprintf("watchers=%d", n), func(b *testing.B) { benchRegister(b, n) })
	}
	b.Run("notready", benchNotReady)
}

// side is one backend under measurement.
type side struct {
	name   string
	writer registry.Registry
	tr     *tracker
}

// tracker matches the events of a reader's watchers to the samples that
// wait for them (by address, unique per sample).
type tracker struct {
	mu   sync.Mutex
	want map[string]*sample // type/address
}

type sample struct {
	t0   time.Time
	lat  []time.Duration
	left int
	done chan struct{}
}

func (tr *tracker) expect(t beacon.EventType, addr string, watchers int) *sample {
	s := &sample{left: watchers, done: make(chan struct{})}
	tr.mu.Lock()
	tr.want[t.String()+"/"+addr] = s
	tr.mu.Unlock()
	s.t0 = time.Now()
	return s
}

func (tr *tracker) seen(t beacon.EventType, addr string) {
	now := time.Now()
	tr.mu.Lock()
	defer tr.mu.Unlock()
	s := tr.want[t.String()+"/"+addr]
	if s == nil || s.left == 0 {
		return
	}
	s.lat = append(s.lat, now.Sub(s.t0))
	if s.left--; s.left == 0 {
		close(s.done)
	}
}

// watchAll opens n watchers on r, feeding tr until ctx ends.
func watchAll(ctx context.Context, b *testing.B, r registry.Discoverer, q beacon.Query, n int, tr *tracker) {
	b.Helper()
	var ready sync.WaitGroup
	for range n {
		w, err := r.Watch(ctx, q)
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = w.Close() })
		ready.Add(1)
		go func() {
			first := true
			for {
				batch, err := w.Next(ctx)
				if err != nil {
					return
				}
				if first {
					first = false
					ready.Done()
				}
				for _, e := range batch.Events {
					tr.seen(e.Type, e.Instance.Address)
				}
			}
		}()
	}
	ready.Wait()
}

func (s *sample) wait(ctx context.Context, b *testing.B, what string) []time.Duration {
	b.Helper()
	select {
	case <-s.done:
		return s.lat
	case <-ctx.Done():
		b.Fatalf("%s: %v", what, ctx.Err())
		return nil
	}
}

func newEtcdSide(ctx context.Context, b *testing.B, n int) *side {
	srv := etcdtest.Start(b, etcdtest.Options{})
	open := func() registry.Registry {
		st, err := etcd.Open(ctx, etcd.Config{Endpoints: srv.Endpoints()})
		if err != nil {
			b.Fatal(err)
		}
		r, err := registry.New(st, registry.Config{})
		if err != nil {
			b.Fatal(err)
		}
		b.Cleanup(func() { _ = r.Close(); _ = st.Close() })
		return r
	}
	s := &side{name: "etcd", writer: open(), tr: &tracker{want: map[string]*sample{}}}
	watchAll(ctx, b, open(), beacon.Query{Namespace: "bench"}, n, s.tr)
	return s
}

func newKubeSide(ctx context.Context, b *testing.B, cp *kubetest.ControlPlane, n int) (*side, *corev1.Pod) {
	ns := cp.Namespace(b)
	pod := cp.ReadyPod(b, ns, "bench")
	s := &side{name: "kube", writer: cp.Registry(b, ns, pod, nil), tr: &tracker{want: map[string]*sample{}}}
	watchAll(ctx, b, cp.Registry(b, ns, nil, nil), beacon.Query{Namespace: "bench"}, n, s.tr)
	return s, pod
}

func benchRegister(b *testing.B, watchers int) {
	cp := kubetest.Shared(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	kubeSide, _ := newKubeSide(ctx, b, cp, watchers)
	sides := []*side{newEtcdSide(ctx, b, watchers), kubeSide}
	added := map[string][]time.Duration{}
	removed := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		for _, s := range sides {
			wctx, wcancel := context.WithTimeout(ctx, kubetest.WaitTimeout)
			addr := fmt.Sprintf("10.%d.%d.%d:80", i/65536%256, i/256%256, i%256)
			smp := s.tr.expect(beacon.Added, addr, watchers)
			reg, err := s.writer.Register(wctx, beacon.Instance{Namespace: "bench", Component: "api", Endpoint: "http", Address: addr})
			if err != nil {
				b.Fatal(err)
			}
			added[s.name] = append(added[s.name], smp.wait(wctx, b, s.name+" added")...)
			smp = s.tr.expect(beacon.Removed, addr, watchers)
			if err := reg.Close(); err != nil {
				b.Fatal(err)
			}
			removed[s.name] = append(removed[s.name], smp.wait(wctx, b, s.name+" removed")...)
			wcancel()
		}
	}
	b.StopTimer()
	report(b, "register", added)
	report(b, "deregister", removed)
}

// benchNotReady: the pod of a registered instance turns NotReady (its
// readiness probe fails; here the harness, acting as the kubelet, sets the
// condition); the EndpointSlice controller updates the slice, and watchers
// drop the instance. There is no etcd counterpart (etcd knows no
// readiness): the closest, a deregistration, is measured beside it.
func benchNotReady(b *testing.B) {
	cp := kubetest.Shared(b)
	ctx, cancel := context.WithCancel(context.Background())
	b.Cleanup(cancel)
	k, pod := newKubeSide(ctx, b, cp, 1)
	e := newEtcdSide(ctx, b, 1)
	lat := map[string][]time.Duration{}
	b.ResetTimer()
	for i := range b.N {
		wctx, wcancel := context.WithTimeout(ctx, kubetest.WaitTimeout)
		addr := fmt.Sprintf("10.200.%d.%d:80", i/256%256, i%256)
		smp := k.tr.expect(beacon.Added, addr, 1)
		reg, err := k.writer.Register(wctx, beacon.Instance{Namespace: "bench", Component: "api", Endpoint: "http", Address: addr})
		if err != nil {
			b.Fatal(err)
		}
		smp.wait(wctx, b, "kube added")
		smp = k.tr.expect(beacon.Removed, addr, 1)
		pod = cp.SetReady(b, pod, false)
		lat["kube"] = append(lat["kube"], smp.wait(wctx, b, "kube removed after NotReady")...)
		smp = k.tr.expect(beacon.Added, addr, 1)
		pod = cp.SetReady(b, pod, true)
		smp.wait(wctx, b, "kube added after Ready")
		_ = reg.Close()

		smp = e.tr.expect(beacon.Added, addr, 1)
		ereg, err := e.writer.Register(wctx, beacon.Instance{Namespace: "bench", Component: "api", Endpoint: "http", Address: addr})
		if err != nil {
			b.Fatal(err)
		}
		smp.wait(wctx, b, "etcd added")
		smp = e.tr.expect(beacon.Removed, addr, 1)
		_ = ereg.Close()
		lat["etcd"] = append(lat["etcd"], smp.wait(wctx, b, "etcd removed")...)
		wcancel()
	}
	b.StopTimer()
	report(b, "removal", lat)
}

// report adds p50/p99 of both backends and their ratio as metrics.
func report(b *testing.B, what string, lat map[string][]time.Duration) {
	for _, p := range []float64{50, 99} {
		k, e := bench.Percentile(lat["kube"], p), bench.Percentile(lat["etcd"], p)
		b.ReportMetric(bench.Ms(k), fmt.Sprintf("kube-%s-p%.0f-ms", what, p))
		b.ReportMetric(bench.Ms(e), fmt.Sprintf("etcd-%s-p%.0f-ms", what, p))
		if e > 0 {
			b.ReportMetric(float64(k)/float64(e), fmt.Sprintf("x-%s-p%.0f", what, p))
		}
	}
}
