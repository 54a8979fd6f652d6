package registry

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/store"
)

func sampleInstance() beacon.Instance {
	return beacon.Instance{
		Namespace: "prod", Component: "api", Endpoint: "grpc", ID: "00000000000000ff",
		Address: "10.0.0.1:9000", Transport: "tcp", Metadata: map[string]string{"zone": "a", "weight": "10", "": "x"},
		Status: beacon.StatusServing, RegisteredAt: time.Date(2026, 11, 25, 13, 0, 0, 123000000, time.UTC),
	}
}

// TestAppendInstanceMatchesMarshalJSON: the direct encoding is
// MarshalJSON's, byte for byte, or declines.
func TestAppendInstanceMatchesMarshalJSON(t *testing.T) {
	cases := map[string]func(*beacon.Instance){
		"as is":          func(*beacon.Instance) {},
		"no metadata":    func(in *beacon.Instance) { in.Metadata = nil },
		"empty metadata": func(in *beacon.Instance) { in.Metadata = map[string]string{} },
		"no status":      func(in *beacon.Instance) { in.Status = "" },
		"draining":       func(in *beacon.Instance) { in.Status = beacon.StatusDraining },
		"whole second":   func(in *beacon.Instance) { in.RegisteredAt = in.RegisteredAt.Truncate(time.Second) },
		"zero time":      func(in *beacon.Instance) { in.RegisteredAt = time.Time{}.UTC() },
		"many metadata": func(in *beacon.Instance) {
			for _, k := range []string{"k", "b", "a", "z", "m", "c", "d", "e", "f", "g", "h"} {
				in.Metadata[k] = k + "v"
			}
		},
	}
	declines := map[string]func(*beacon.Instance){
		"html":       func(in *beacon.Instance) { in.Address = "http://h/?a=1&b=<2>" },
		"quote":      func(in *beacon.Instance) { in.Metadata["q"] = `say "hi"` },
		"unicode":    func(in *beacon.Instance) { in.Metadata["zone"] = "zürich" },
		"control":    func(in *beacon.Instance) { in.Transport = "a\tb" },
		"backslash":  func(in *beacon.Instance) { in.Metadata[`a\b`] = "1" },
		"local time": func(in *beacon.Instance) { in.RegisteredAt = in.RegisteredAt.In(time.FixedZone("X", 3600)) },
		"year 10000": func(in *beacon.Instance) { in.RegisteredAt = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) },
	}
	for name, mutate := range cases {
		in := sampleInstance()
		mutate(&in)
		want, err := in.MarshalJSON()
		if err != nil {
			t.Fatalf("%s: MarshalJSON: %v", name, err)
		}
		got, ok := appendInstance(nil, in)
		if !ok || !bytes.Equal(got, want) {
			t.Errorf("%s: appendInstance = %q, %v; MarshalJSON gives %q", name, got, ok, want)
		}
	}
	for name, mutate := range declines {
		in := sampleInstance()
		mutate(&in)
		if got, ok := appendInstance([]byte("x"), in); ok || string(got) != "x" {
			t.Errorf("%s: appendInstance = %q, %v; want it to decline", name, got, ok)
		}
	}
}

// FuzzAppendInstance: whatever the fields, the direct encoding is
// MarshalJSON's or declines.
func FuzzAppendInstance(f *testing.F) {
	f.Add("prod", "api", "grpc", "00000000000000ff", "10.0.0.1:9000", "tcp", "zone", "a", "serving", int64(1764075600123000000))
	f.Add("a&b", "<", ">", `"`, "\\", "\x00", "ü", "\xff", "", int64(-1<<62))
	f.Fuzz(func(t *testing.T, ns, comp, ep, id, addr, tr, mk, mv, status string, nanos int64) {
		in := beacon.Instance{
			Namespace: ns, Component: comp, Endpoint: ep, ID: id, Address: addr, Transport: tr,
			Metadata: map[string]string{mk: mv, "w": "1"}, Status: beacon.Status(status),
			RegisteredAt: time.Unix(0, nanos).UTC(),
		}
		got, ok := appendInstance(nil, in)
		want, err := in.MarshalJSON()
		if !ok {
			return
		}
		if err != nil {
			t.Fatalf("appendInstance encoded %q where MarshalJSON fails: %v", got, err)
		}
		if !bytes.Equal(got, want) {
			t.Fatalf("appendInstance = %q; MarshalJSON gives %q", got, want)
		}
	})
}

// FuzzEncodeRoundTrips: a registration keeps only its instance's stored
// value and decodes it for Instance, so whatever Register accepts
// (prepare) must decode to the instance prepare made of it — its
// metadata (empty reads as none), check and time included.
func FuzzEncodeRoundTrips(f *testing.F) {
	f.Add("prod", "api", "grpc", "00000000000000ff", "10.0.0.1:9000", "tcp", "zone", "a", "", int64(1764075600123456789), "grpc:svc", int64(10e9))
	f.Add("a", "b", "c", "", "h:1", "", "k", "say \"hi\" ü", "draining", int64(0), "http:/healthz", int64(0))
	f.Add("a", "b", "c", "", "h:1", "", "", "", "", int64(-1), "", int64(-1))
	ks, err := beacon.NewKeyspace("/beacon")
	if err != nil {
		f.Fatal(err)
	}
	r := &StoreRegistry{cfg: Config{MaxMetadataSize: beacon.DefaultMaxMetadataSize}, ks: ks}
	f.Fuzz(func(t *testing.T, ns, comp, ep, id, addr, tr, mk, mv, status string, nanos int64, check string, ttl int64) {
		in := beacon.Instance{
			Namespace: ns, Component: comp, Endpoint: ep, ID: id, Address: addr, Transport: tr,
			Metadata: map[string]string{}, Status: beacon.Status(status),
		}
		if mk != "" {
			in.Metadata[mk] = mv
		}
		if nanos >= 0 {
			in.RegisteredAt = time.Unix(0, nanos)
		}
		if c, err := beacon.ParseCheck(check); err == nil {
			in.Check = &c
		}
		want, val, err := r.prepare(in, time.Duration(ttl))
		if err != nil {
			return
		}
		reg := &registration{r: r, key: r.ks.Key(want.Ref()), ref: want.Ref()}
		reg.advertise(val)
		got := reg.Instance()
		if !sameInstance(got, want) || got.RegisteredAt.Location() != time.UTC || got.Health != nil ||
			(got.Check == nil) != (want.Check == nil) || (got.Check != nil && *got.Check != *want.Check) {
			t.Fatalf("registered %+v (check %+v), stored %s, Instance() = %+v (check %+v)", want, want.Check, val, got, got.Check)
		}
	})
}

func BenchmarkEncodeInstance(b *testing.B) {
	in := sampleInstance()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(in, 10*time.Second); err != nil {
			b.Fatal(err)
		}
	}
}

// TestStoredTTL: the lease TTL a value declares is read back as written,
// from Beacon's own encoding and from any other JSON form of the member;
// a TTL outside the store's range, or none, reads as 0.
func TestStoredTTL(t *testing.T) {
	in := sampleInstance()
	for _, ttl := range []time.Duration{time.Second, 3 * time.Second, 1500 * time.Millisecond, 10 * time.Second, store.MaxLeaseTTL} {
		for _, quoted := range []bool{false, true} {
			x := in.Clone()
			delete(x.Metadata, "") // not a valid instance
			if quoted {
				x.Metadata["q"] = `say "hi"` // encoded by MarshalJSON
			}
			val, err := encode(x, ttl)
			if err != nil {
				t.Fatal(err)
			}
			back, err := beacon.UnmarshalInstance(val)
			if err != nil || !sameInstance(back, x) {
				t.Fatalf("%s: decoded %+v, %v", val, back, err)
			}
			if got := storedTTL(val); got != ttl {
				t.Errorf("storedTTL(%s) = %v, want %v", val, got, ttl)
			}
		}
	}
	for _, ttl := range []time.Duration{0, -time.Second, store.MinLeaseTTL - time.Millisecond, store.MaxLeaseTTL + time.Second} {
		val, err := encode(in, ttl)
		if err != nil {
			t.Fatal(err)
		}
		if bytes.Contains(val, []byte("lease_ttl_ms")) || storedTTL(val) != 0 {
			t.Errorf("TTL %v written as %s", ttl, val)
		}
	}
	cases := map[string]time.Duration{
		`{"lease_ttl_ms":3000,"id":"x"}`:                    3 * time.Second, // not last
		`{"id":"x", "lease_ttl_ms" : 3000 }`:                3 * time.Second, // spaces
		`{"lease_ttl_ms":3e3}`:                              0,               // a whole number of milliseconds only
		`{"lease_ttl_ms":"3000"}`:                           0,               // a string
		`{"lease_ttl_ms":-3000}`:                            0,
		`{"lease_ttl_ms":999}`:                              0, // below the store's least TTL
		`{"lease_ttl_ms":99999999999999999999999}`:          0,
		`{"metadata":{"lease_ttl_ms":"3000"}}`:              0,               // nested
		`{"m":{"a":"1","lease_ttl_ms":3000}}`:               0,               // nested, at the end
		`{"a":"x\",\"lease_ttl_ms\":3000"}`:                 0,               // inside a string
		`{"lease_ttl_ms":1000,"lease_ttl_ms":2000}`:         2 * time.Second, // the last, as encoding/json
		`{"lease_ttl_ms":5000,"Lease_TTL_MS":1000}`:         5 * time.Second, // this name exactly
		`{"address":"h:1","lease_ttl_ms":4000}`:             4 * time.Second,
		`{"address":"h:1","lease_ttl_ms":86400000}`:         store.MaxLeaseTTL,
		`{"address":"h:1","lease_ttl_ms":86400001}`:         0,
		`{"address":"h:1","lease_ttl_ms":4000.5}`:           0,
		`{"address":"h:1"}`:                                 0,
		`{"address":"lease_ttl_ms","x":"\"lease_ttl_ms\""}`: 0,
	}
	for val, want := range cases {
		if got := storedTTL([]byte(val)); got != want {
			t.Errorf("storedTTL(%s) = %v, want %v", val, got, want)
		}
	}
}

// FuzzStoredTTL: for any JSON object, storedTTL agrees with what
// encoding/json reads from the member (its fast path never reads a
// member that is not the object's own), and never panics on anything.
func FuzzStoredTTL(f *testing.F) {
	f.Add([]byte(`{"address":"h:1","lease_ttl_ms":4000}`))
	f.Add([]byte(`{"m":{"a":"1","lease_ttl_ms":3000}}`))
	f.Add([]byte(`{"a":"x\",\"lease_ttl_ms\":3000"}`))
	f.Add([]byte(`{"lease_ttl_ms":1000,"lease_ttl_ms":2000}`))
	f.Add([]byte(`{"lease_ttl_ms":3e3}`))
	f.Add([]byte(`{"lease_ttl_ms":5000,"Lease_TTL_MS":1000}`))
	f.Fuzz(func(t *testing.T, val []byte) {
		got := storedTTL(val)
		var obj map[string]json.RawMessage
		if json.Unmarshal(val, &obj) != nil {
			return // not an object: anything but a panic will do
		}
		var want time.Duration
		var ms int64
		if raw, ok := obj["lease_ttl_ms"]; ok && json.Unmarshal(raw, &ms) == nil &&
			ms >= store.MinLeaseTTL.Milliseconds() && ms <= store.MaxLeaseTTL.Milliseconds() {
			want = time.Duration(ms) * time.Millisecond
		}
		if got != want {
			t.Fatalf("storedTTL(%s) = %v, encoding/json reads %v", val, got, want)
		}
	})
}

// sameInstance is the test's own field-by-field comparison (not
// beacon.Instance.Equal, the code under test's).
func sameInstance(a, b beacon.Instance) bool {
	if len(a.Metadata) != len(b.Metadata) {
		return false
	}
	for k, v := range a.Metadata {
		if w, ok := b.Metadata[k]; !ok || w != v {
			return false
		}
	}
	return a.Namespace == b.Namespace && a.Component == b.Component && a.Endpoint == b.Endpoint &&
		a.ID == b.ID && a.Address == b.Address && a.Transport == b.Transport && a.Status == b.Status &&
		a.RegisteredAt.Equal(b.RegisteredAt)
}
