package registry

import (
	"bytes"
	"testing"
	"time"

	"github.com/beaconplane/beacon"
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

func BenchmarkEncodeInstance(b *testing.B) {
	in := sampleInstance()
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(in); err != nil {
			b.Fatal(err)
		}
	}
}
