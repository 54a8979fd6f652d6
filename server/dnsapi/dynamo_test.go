package dnsapi

import (
	"context"
	"slices"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/dynamotest"
	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// DNS over a registry of the dynamo layout, on a real etcd: what Dynamo's
// workers write, on their leases, answers dig under Dynamo's names with
// underscores (clear_kv_blocks); a namespace nested with dots and an
// endpoint starting with '_' are left out (counted); a revoked lease takes
// the worker's names away.
func TestDigDynamoWorkers(t *testing.T) {
	t.Parallel()
	e := etcdtest.Start(t, etcdtest.Options{})
	ctx, cancel := context.WithTimeout(context.Background(), testDeadline)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{Endpoints: e.Endpoints()})
	if err != nil {
		t.Fatal(err)
	}
	r, err := registry.New(st, registry.Config{Layout: registry.LayoutDynamo})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		_ = r.Close()
		_ = st.Close()
	})
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})

	cli := e.Client(t)
	w1 := dynamotest.Start(t, cli, time.Minute, true)
	w2 := dynamotest.Start(t, cli, time.Minute, true)
	w1.Endpoint(t, "dynamo", "backend", "generate", dynamotest.TCP("10.0.0.5:9999", "generate"))
	w1.Endpoint(t, "dynamo", "backend", "clear_kv_blocks", dynamotest.TCP("10.0.0.5:9999", "clear_kv_blocks"))
	w1.Model(t, "dynamo", "backend", "generate", "Qwen/Qwen3-0.6B", "")
	w2.Endpoint(t, "dynamo", "backend", "generate", dynamotest.HTTP("10.0.0.6:8888", "generate"))
	w2.Endpoint(t, "dynamo.tenant_1", "backend", "generate", dynamotest.TCP("10.0.0.6:9999", "generate"))
	w2.Endpoint(t, "dynamo", "backend", "_private", dynamotest.TCP("10.0.0.6:9999", "_private"))
	waitView(t, s, "every worker's instances", func() bool {
		v := s.view.Load()
		return v != nil && v.zone.instances == 3 && v.zone.unanswerable == 2
	})
	if got := metricValue(t, metrics, "beacon_dns_unanswerable_instances"); got != 2 {
		t.Errorf("beacon_dns_unanswerable_instances = %v, want 2 (the dotted namespace, the '_' endpoint)", got)
	}

	if got := sorted(dig(t, addr, "generate.backend.dynamo.beacon.", "A").rdata("A")); !slices.Equal(got, []string{"10.0.0.5", "10.0.0.6"}) {
		t.Errorf("A generate.backend.dynamo = %v", got)
	}
	id1 := w1.Hex()
	for len(id1) < 16 {
		id1 = "0" + id1
	}
	wantSRV := []string{"10 10 9999 " + id1 + ".clear_kv_blocks.backend.dynamo.beacon."}
	if got := dig(t, addr, "_clear_kv_blocks._tcp.backend.dynamo.beacon.", "SRV").rdata("SRV"); !slices.Equal(got, wantSRV) {
		t.Errorf("SRV _clear_kv_blocks._tcp = %v, want %v", got, wantSRV)
	}
	txt := dig(t, addr, id1+".generate.backend.dynamo.beacon.", "TXT").rdata("TXT")
	if !slices.Contains(txt, `"dynamo.models=Qwen/Qwen3-0.6B"`) || !slices.Contains(txt, `"dynamo.target=10.0.0.5:9999/generate"`) {
		t.Errorf("TXT of w1's generate = %v, want its model and target", txt)
	}
	for _, name := range []string{"generate.backend.dynamo.tenant_1.beacon.", "generate.backend.tenant_1.beacon."} {
		if res := dig(t, addr, name, "A"); res.status != "NXDOMAIN" {
			t.Errorf("A %s: %s, want NXDOMAIN (a dotted namespace is left out)", name, res.status)
		}
	}

	w1.Revoke(t)
	waitView(t, s, "w1's instances to go", func() bool { return s.view.Load().zone.instances == 1 })
	if got := dig(t, addr, "generate.backend.dynamo.beacon.", "A").rdata("A"); !slices.Equal(got, []string{"10.0.0.6"}) {
		t.Errorf("A generate.backend.dynamo after w1's lease ended = %v", got)
	}
	if res := dig(t, addr, "clear_kv_blocks.backend.dynamo.beacon.", "A"); res.status != "NXDOMAIN" {
		t.Errorf("A clear_kv_blocks after w1's lease ended: %s", res.status)
	}
	if q := query(t, addr, "udp", "_private.backend.dynamo.beacon.", dns.TypeA, 0); q.Rcode != dns.RcodeNameError {
		t.Errorf("A _private: rcode %d, want NXDOMAIN", q.Rcode)
	}
}
