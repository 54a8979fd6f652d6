package naming_test

import (
	"errors"
	"strings"
	"testing"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/naming"
)

func TestParseTarget(t *testing.T) {
	ok := beacon.Query{Namespace: "prod", Component: "api", Endpoint: "grpc"}
	for _, tc := range []struct {
		target string
		want   beacon.Query
		errHas string // empty: valid
	}{
		{"beacon:///prod/api/grpc", ok, ""},
		{"beacon:prod/api/grpc", ok, ""},
		{"beacon:///a-1/b2/c-3", beacon.Query{Namespace: "a-1", Component: "b2", Endpoint: "c-3"}, ""},
		{"beacon:///%70rod/api/grpc", ok, ""}, // percent-encoding of a valid name
		{"beacon://prod/api/grpc", beacon.Query{}, `beacon:///prod/api/grpc (three slashes)`},
		{"beacon://user@host/prod/api/grpc", beacon.Query{}, `authority "user@host"`},
		{"beacon://host:99/prod/api/grpc", beacon.Query{}, `authority "host:99"`},
		{"beacon:///prod/api", beacon.Query{}, "got 2 path segments"},
		{"beacon:///prod/api/grpc/", beacon.Query{}, "got 4 path segments"},
		{"beacon:///prod/api/grpc/0123456789abcdef", beacon.Query{}, "got 4 path segments"},
		{"beacon:///", beacon.Query{}, "got 0 path segments"},
		{"beacon:", beacon.Query{}, "got 0 path segments"},
		{"beacon:///prod//grpc", beacon.Query{}, `invalid component ""`},
		{"beacon:///Prod/api/grpc", beacon.Query{}, `invalid namespace "Prod": must be one or more names of 1-63 lower-case letters`},
		{"beacon:///prod/api/grpc.1", beacon.Query{}, `invalid endpoint "grpc.1"`},
		// The NVIDIA Dynamo runtime's names, which Beacon serves read-only.
		{"beacon:///dynamo.t_1/backend/clear_kv_blocks", beacon.Query{Namespace: "dynamo.t_1", Component: "backend", Endpoint: "clear_kv_blocks"}, ""},
		{"beacon:///prod/api/grpc?lb=rr", beacon.Query{}, "query parameters"},
		{"beacon:///prod/api/grpc?", beacon.Query{}, "query parameters"},
		{"beacon:///prod/api/grpc#x", beacon.Query{}, "fragments"},
		{"etcd:///prod/api/grpc", beacon.Query{}, `scheme "etcd" is not "beacon"`},
		{"prod/api/grpc", beacon.Query{}, "has no scheme"},
		{"beacon://[::1", beacon.Query{}, "not a URL"},
		{"", beacon.Query{}, "has no scheme"},
	} {
		got, err := naming.ParseTarget(tc.target)
		if tc.errHas == "" {
			if err != nil || got != tc.want {
				t.Errorf("ParseTarget(%q) = %+v, %v; want %+v", tc.target, got, err, tc.want)
			}
			continue
		}
		if err == nil || !errors.Is(err, naming.ErrInvalidTarget) || !strings.Contains(err.Error(), tc.errHas) {
			t.Errorf("ParseTarget(%q) error = %v; want ErrInvalidTarget containing %q", tc.target, err, tc.errHas)
		}
	}
}

func TestTargetRoundTrip(t *testing.T) {
	q := beacon.Query{Namespace: "prod", Component: "api", Endpoint: "grpc"}
	s := naming.Target(q)
	if s != "beacon:///prod/api/grpc" {
		t.Errorf("Target = %q", s)
	}
	if got, err := naming.ParseTarget(s); err != nil || got != q {
		t.Errorf("ParseTarget(Target(q)) = %+v, %v", got, err)
	}
}

func FuzzParseTarget(f *testing.F) {
	for _, s := range []string{
		"beacon:///prod/api/grpc", "beacon:prod/api/grpc", "beacon://prod/api/grpc",
		"beacon:///prod/api", "beacon:///prod/api/grpc?x", "beacon:///%zz/a/b", "beacon:////a/b",
		"beacon://[::1]:80/a/b/c", "beacon:///a/b/c#", "",
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		q, err := naming.ParseTarget(s)
		if err != nil {
			if !errors.Is(err, naming.ErrInvalidTarget) {
				t.Fatalf("ParseTarget(%q) error %v does not match ErrInvalidTarget", s, err)
			}
			return
		}
		// Every accepted target names a full, valid endpoint and
		// round-trips through Target.
		if q.Endpoint == "" || q.Validate() != nil {
			t.Fatalf("ParseTarget(%q) accepted %+v", s, q)
		}
		again, err := naming.ParseTarget(naming.Target(q))
		if err != nil || again != q {
			t.Fatalf("round trip of %q: %+v, %v", s, again, err)
		}
	})
}
