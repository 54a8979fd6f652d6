package kube_test

import (
	"strings"
	"testing"

	"github.com/beaconplane/beacon/internal/testkit/kubetest"
	"github.com/beaconplane/beacon/server/dnsapi"
	"github.com/miekg/dns"
)

// The DNS interface over the Kubernetes registry: SRV records of a
// registered instance appear once its pod is Ready and go when it is
// NotReady.
func TestDNSOverKubernetes(t *testing.T) {
	cp := kubetest.Shared(t)
	ns := cp.Namespace(t)
	pod := cp.ReadyPod(t, ns, "dns")
	srv, err := dnsapi.New(cp.Registry(t, ns, nil, nil), dnsapi.Config{})
	if err != nil {
		t.Fatal(err)
	}
	pc, ln, err := dnsapi.Listen("127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	if err := srv.Serve(pc, ln); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { _ = srv.Close() })
	id := register(t, cp.Registry(t, ns, pod, nil), inst("10.12.0.1:8080")).Instance().ID
	srvRecords := func() []dns.RR {
		q := new(dns.Msg)
		q.SetQuestion("http.api.demo.beacon.", dns.TypeSRV)
		ans, _, err := new(dns.Client).Exchange(q, ln.Addr().String())
		if err != nil {
			t.Fatal(err)
		}
		return ans.Answer
	}
	// Wait on the DNS server's updates until the answer holds the instance.
	until := func(what string, cond func([]dns.RR) bool) {
		t.Helper()
		ctx := kubetest.Ctx(t)
		for {
			updated := srv.Updated()
			if srv.Ready() && cond(srvRecords()) {
				return
			}
			select {
			case <-updated:
			case <-ctx.Done():
				t.Fatalf("waiting for %s: %v", what, ctx.Err())
			}
		}
	}
	until("the SRV record", func(rrs []dns.RR) bool {
		return len(rrs) == 1 && rrs[0].(*dns.SRV).Port == 8080 && strings.HasPrefix(rrs[0].(*dns.SRV).Target, id)
	})
	cp.SetReady(t, pod, false)
	until("no SRV record once the pod is NotReady", func(rrs []dns.RR) bool { return len(rrs) == 0 })
}
