package etcdnaming_test

import (
	"errors"
	"net/url"
	"reflect"
	"strings"
	"testing"

	"github.com/beaconplane/beacon/naming/etcdnaming"
	"github.com/beaconplane/beacon/naming/internal/cctest"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/attributes"
	"google.golang.org/grpc/resolver"
)

func TestResolverFollowsEndpoints(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	m := newManager(t, st, "foo/svc")
	if err := m.AddEndpoint(ctx, "foo/svc/b", etcdnaming.Endpoint{Addr: "10.0.0.2:1", Metadata: map[string]any{"zone": "b", "weight": 2}}); err != nil {
		t.Fatal(err)
	}
	if err := m.AddEndpoint(ctx, "foo/svc/a", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	// A sibling prefix is not part of the target (etcd#15022).
	if _, err := st.Put(ctx, "foo/svcx/c", []byte(`{"Addr":"10.0.0.9:1"}`)); err != nil {
		t.Fatal(err)
	}
	cc := buildResolver(t, st, "etcd:///foo/svc")
	i, s := cc.WaitState(t, 0, "[10.0.0.1:1 10.0.0.2:1]") // sorted by key

	if key, ok := etcdnaming.KeyFrom(s.Endpoints[1].Attributes); !ok || key != "foo/svc/b" {
		t.Errorf("KeyFrom = %q, %v", key, ok)
	}
	md, ok := etcdnaming.MetadataFrom(s.Endpoints[1].Attributes)
	if want := map[string]any{"zone": "b", "weight": 2.0}; !ok || !reflect.DeepEqual(md, want) {
		t.Errorf("MetadataFrom = %#v, %v", md, ok)
	}
	if js, _ := etcdnaming.MetadataJSON(s.Endpoints[0].Attributes); js != "null" {
		t.Errorf("MetadataJSON of an endpoint without metadata = %q", js)
	}
	if !s.Addresses[1].BalancerAttributes.Equal(s.Endpoints[1].Attributes) { //nolint:staticcheck // the legacy address list
		t.Error("addresses lack the endpoint attributes")
	}
	if _, ok := etcdnaming.MetadataFrom(attributes.New("x", 1)); ok {
		t.Error("MetadataFrom read foreign attributes")
	}

	// A multi-endpoint update arrives as one state: no intermediate one.
	if err := m.Update(ctx,
		etcdnaming.NewDeleteUpdate("foo/svc/a"),
		etcdnaming.NewAddUpdate("foo/svc/c", etcdnaming.Endpoint{Addr: "10.0.0.3:1"})); err != nil {
		t.Fatal(err)
	}
	j, _ := cc.WaitState(t, i, "[10.0.0.2:1 10.0.0.3:1]")
	if j != i+1 {
		t.Errorf("the update took %d states: %v", j-i, cc.Events()[i:j])
	}
	// Metadata changes are pushed too.
	if err := m.AddEndpoint(ctx, "foo/svc/c", etcdnaming.Endpoint{Addr: "10.0.0.3:1", Metadata: "m"}); err != nil {
		t.Fatal(err)
	}
	_, s = cc.WaitState(t, j, "[10.0.0.2:1 10.0.0.3:1]")
	if md, _ := etcdnaming.MetadataFrom(s.Endpoints[1].Attributes); md != "m" {
		t.Errorf("metadata after update = %#v", md)
	}
}

func TestResolverSkipsValuesThatAreNotEndpoints(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	reg := prometheus.NewRegistry()
	for key, v := range map[string]string{
		"svc/a": `{"Addr":"10.0.0.1:1"}`, "svc/b": `not json`, "svc/c": `null`,
		"svc/d": `{"Addr":"unix:///tmp/sock"}`, "svc/e": `{"Addr":"10.0.0.1:1"}`,
	} {
		if _, err := st.Put(ctx, key, []byte(v)); err != nil {
			t.Fatal(err)
		}
	}
	cc := buildResolver(t, st, "etcd:///svc", etcdnaming.WithMetrics(reg))
	i, _ := cc.WaitState(t, 0, "[10.0.0.1:1]")
	for reason, want := range map[string]float64{"invalid_json": 1, "no_addr": 1, "not_dialable": 1, "duplicate_address": 1} {
		if got := counter(t, reg, "beacon_naming_skipped_total", reason); got != want {
			t.Errorf("skipped %s = %v, want %v", reason, got, want)
		}
	}
	// A valid endpoint overwritten with garbage is gone (its writer no
	// longer advertises the old value); the new skip is counted once.
	if _, err := st.Put(ctx, "svc/a", []byte(`{broken`)); err != nil {
		t.Fatal(err)
	}
	if _, err := st.Delete(ctx, "svc/e"); err != nil {
		t.Fatal(err)
	}
	i, _ = cc.WaitState(t, i, "[]")
	i, _ = cc.WaitError(t, i, "1 endpoint(s), none with an address gRPC can dial")
	if _, err := st.Delete(ctx, "svc/d"); err != nil {
		t.Fatal(err)
	}
	_, err := cc.WaitError(t, i, "3 key(s) hold values that are not endpoints")
	if !errors.Is(err, etcdnaming.ErrNoEndpoints) {
		t.Errorf("error %v; want ErrNoEndpoints", err)
	}
	if got := counter(t, reg, "beacon_naming_skipped_total", "invalid_json"); got != 2 {
		t.Errorf("invalid_json = %v, want 2", got)
	}
}

func TestResolverNoEndpointsReportsError(t *testing.T) {
	ctx := testContext(t)
	st := memStore(t)
	cc := buildResolver(t, st, "etcd:///empty/svc")
	i, err := cc.WaitError(t, 0, `no endpoints under "empty/svc/"`)
	if !strings.Contains(err.Error(), "none registered") {
		t.Errorf("error %q", err)
	}
	m := newManager(t, st, "empty/svc")
	if err := m.AddEndpoint(ctx, "empty/svc/1", etcdnaming.Endpoint{Addr: "10.0.0.1:1"}); err != nil {
		t.Fatal(err)
	}
	cc.WaitState(t, i, "[10.0.0.1:1]")
}

func TestResolverStoreClosed(t *testing.T) {
	st := memStore(t)
	cc := buildResolver(t, st, "etcd:///svc")
	i, _ := cc.WaitError(t, 0, "none registered")
	_ = st.Close()
	_, err := cc.WaitError(t, i, "closed")
	if !errors.Is(err, etcdnaming.ErrStale) {
		t.Errorf("error %v; want ErrStale", err)
	}
}

func TestParseTarget(t *testing.T) {
	for _, tc := range []struct {
		target, want, errHas string
	}{
		{"etcd:///foo/bar", "foo/bar", ""},
		{"etcd:foo/bar", "foo/bar", ""},
		{"etcd:////services/x", "/services/x", ""},
		{"etcd://foo/bar", "", "etcd:///foo/bar (three slashes)"},
		{"etcd:///foo/bar/", "", "remove the trailing '/'"},
		{"etcd:///", "", "empty target"},
		{"etcd:///foo?x=1", "", "query parameters"},
		{"beacon:///foo", "", `scheme must be "etcd"`},
		{"etcd://[::1", "", "not a URL"},
	} {
		got, err := etcdnaming.ParseTarget(tc.target)
		if tc.errHas == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseTarget(%q) = %q, %v; want %q", tc.target, got, err, tc.want)
			}
			continue
		}
		if !errors.Is(err, etcdnaming.ErrInvalidTarget) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("ParseTarget(%q) error = %v; want ErrInvalidTarget containing %q", tc.target, err, tc.errHas)
		}
	}
	b, err := etcdnaming.NewBuilder(memStore(t))
	if err != nil {
		t.Fatal(err)
	}
	u, _ := url.Parse("etcd://host/foo")
	if _, err := b.Build(resolver.Target{URL: *u}, cctest.New(), resolver.BuildOptions{}); !errors.Is(err, etcdnaming.ErrInvalidTarget) {
		t.Errorf("Build with an authority: %v", err)
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{"etcd:///foo/bar", "etcd:foo", "etcd://h/foo", "etcd:///foo/", "etcd:////x", "etcd:///%ff", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		target, err := etcdnaming.ParseTarget(s)
		if err != nil {
			if !errors.Is(err, etcdnaming.ErrInvalidTarget) {
				t.Fatalf("ParseTarget(%q) error %v does not match ErrInvalidTarget", s, err)
			}
			return
		}
		if target == "" || strings.HasSuffix(target, "/") || store.ValidateKey(target+"/") != nil {
			t.Fatalf("ParseTarget(%q) accepted %q", s, target)
		}
	})
}

func TestNewBuilderValidates(t *testing.T) {
	if _, err := etcdnaming.NewBuilder(nil); !errors.Is(err, etcdnaming.ErrInvalidConfig) {
		t.Errorf("nil store: %v", err)
	}
	for _, s := range []string{"", "ETCD", "1x"} {
		if _, err := etcdnaming.NewBuilder(memStore(t), etcdnaming.WithScheme(s)); !errors.Is(err, etcdnaming.ErrInvalidConfig) {
			t.Errorf("scheme %q: %v", s, err)
		}
	}
	b, err := etcdnaming.NewBuilder(memStore(t), etcdnaming.WithScheme("etcd-eu"))
	if err != nil || b.Scheme() != "etcd-eu" {
		t.Errorf("scheme etcd-eu: %v", err)
	}
}
