package beacon

import (
	"encoding/json"
	"errors"
	"strings"
	"testing"
	"time"
)

func validInstance() Instance {
	return Instance{
		Namespace: "prod", Component: "vllm", Endpoint: "generate", ID: "3f2a9c0d11e4b5a7",
		Address: "10.0.0.7:9000", Transport: "grpc",
		Metadata:     map[string]string{"zone": "a", "weight": "3"},
		Status:       StatusServing,
		RegisteredAt: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC),
	}
}

func TestInstanceJSONRoundTrip(t *testing.T) {
	in := validInstance()
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	for _, field := range []string{`"namespace":"prod"`, `"id":"3f2a9c0d11e4b5a7"`, `"status":"serving"`, `"registered_at":"2026-11-22T10:00:00Z"`, `"transport":"grpc"`} {
		if !strings.Contains(string(b), field) {
			t.Errorf("JSON %s lacks %s", b, field)
		}
	}
	out, err := UnmarshalInstance(b)
	if err != nil {
		t.Fatal(err)
	}
	if !out.Equal(in) {
		t.Fatalf("round trip: got %+v, want %+v", out, in)
	}
}

func TestInstanceValidate(t *testing.T) {
	tests := []struct {
		name   string
		mutate func(*Instance)
		want   error
	}{
		{"ok", func(*Instance) {}, nil},
		{"url address", func(i *Instance) { i.Address = "nats://127.0.0.1:4222/subject" }, nil},
		{"ipv6", func(i *Instance) { i.Address = "[::1]:80" }, nil},
		{"bad namespace", func(i *Instance) { i.Namespace = "Prod" }, ErrInvalidName},
		{"bad id", func(i *Instance) { i.ID = "42" }, ErrInvalidID},
		{"no address", func(i *Instance) { i.Address = "" }, ErrInvalidAddress},
		{"no port", func(i *Instance) { i.Address = "10.0.0.7" }, ErrInvalidAddress},
		{"port 0", func(i *Instance) { i.Address = "10.0.0.7:0" }, ErrInvalidAddress},
		{"port too big", func(i *Instance) { i.Address = "10.0.0.7:65536" }, ErrInvalidAddress},
		{"space", func(i *Instance) { i.Address = "10.0.0.7 :80" }, ErrInvalidAddress},
		{"metadata too large", func(i *Instance) { i.Metadata = map[string]string{"k": strings.Repeat("v", 4096)} }, ErrMetadataTooLarge},
		{"metadata at limit", func(i *Instance) { i.Metadata = map[string]string{"k": strings.Repeat("v", 4095)} }, nil},
		{"empty metadata key", func(i *Instance) { i.Metadata = map[string]string{"": "v"} }, ErrInvalidMetadata},
		{"newline in metadata value", func(i *Instance) { i.Metadata = map[string]string{"k": "a\nb"} }, ErrInvalidMetadata},
		{"NUL in metadata value", func(i *Instance) { i.Metadata = map[string]string{"k": "a\x00b"} }, ErrInvalidMetadata},
		{"tab in metadata value", func(i *Instance) { i.Metadata = map[string]string{"k": "a\tb"} }, ErrInvalidMetadata},
		{"C1 control in metadata value", func(i *Instance) { i.Metadata = map[string]string{"k": "a\u0085b"} }, ErrInvalidMetadata},
		{"printable metadata value", func(i *Instance) { i.Metadata = map[string]string{"k": "a b=c, ünï"} }, nil},
		{"host label of 63", func(i *Instance) { i.Address = strings.Repeat("a", 63) + ".example.com:80" }, nil},
		{"host label of 64", func(i *Instance) { i.Address = strings.Repeat("a", 64) + ".example.com:80" }, ErrInvalidAddress},
		{"host label of 254", func(i *Instance) { i.Address = strings.Repeat("a", 254) + ":80" }, ErrInvalidAddress},
		{"host name of 253", func(i *Instance) { i.Address = strings.Repeat(strings.Repeat("a", 49)+".", 5) + "abc.:80" }, nil},
		{"host name of 254", func(i *Instance) { i.Address = strings.Repeat(strings.Repeat("a", 49)+".", 5) + "abcd:80" }, ErrInvalidAddress},
		{"empty host label", func(i *Instance) { i.Address = "a..example.com:80" }, ErrInvalidAddress},
		{"URL host label of 64", func(i *Instance) { i.Address = "nats://" + strings.Repeat("a", 64) + ":4222/s" }, ErrInvalidAddress},
		{"URL without host", func(i *Instance) { i.Address = "unix:///run/app.sock" }, nil},
		// Host names resolvers and Beacon's DNS carry, and only those:
		// before, the next six were stored and then left out of DNS.
		{"host name with '-' and '_'", func(i *Instance) { i.Address = "api-1.my_svc.example.com:80" }, nil},
		{"markup as host", func(i *Instance) { i.Address = "<script>alert(1)</script>:80" }, ErrInvalidAddress},
		{"unicode host", func(i *Instance) { i.Address = "é.com:80" }, ErrInvalidAddress},
		{"punycode host", func(i *Instance) { i.Address = "xn--9ca.com:80" }, nil},
		{"label starting with '-'", func(i *Instance) { i.Address = "-a.com:80" }, ErrInvalidAddress},
		{"label ending with '-'", func(i *Instance) { i.Address = "a-.com:80" }, ErrInvalidAddress},
		{"URL host with '*'", func(i *Instance) { i.Address = "nats://a*b:4222/s" }, ErrInvalidAddress},
		{"signed port", func(i *Instance) { i.Address = "1.2.3.4:+80" }, ErrInvalidAddress},
		{"port with leading zeros", func(i *Instance) { i.Address = "1.2.3.4:0080" }, ErrInvalidAddress},
		// And the second round: URLs, brackets, zones, numbers.
		{"URL port out of range", func(i *Instance) { i.Address = "nats://host:99999" }, ErrInvalidAddress},
		{"URL port 0", func(i *Instance) { i.Address = "nats://host:0" }, ErrInvalidAddress},
		{"URL empty port", func(i *Instance) { i.Address = "nats://host:" }, ErrInvalidAddress},
		{"URL port without host", func(i *Instance) { i.Address = "http://:80/" }, ErrInvalidAddress},
		{"URL of nothing", func(i *Instance) { i.Address = "http:///" }, ErrInvalidAddress},
		{"URL with credentials", func(i *Instance) { i.Address = "http://user:pass@host:80/x" }, ErrInvalidAddress},
		{"URL with an empty user", func(i *Instance) { i.Address = "foo://@/x" }, ErrInvalidAddress},
		{"URL with an IPv6 host", func(i *Instance) { i.Address = "http://[2001:db8::1]:8080/x" }, nil},
		{"brackets around a name", func(i *Instance) { i.Address = "[host]:80" }, ErrInvalidAddress},
		{"brackets around IPv4", func(i *Instance) { i.Address = "[1.2.3.4]:80" }, ErrInvalidAddress},
		{"IPv6 with a zone", func(i *Instance) { i.Address = "[fe80::1%eth0]:80" }, nil},
		{"IPv6 zone with a slash", func(i *Instance) { i.Address = "[fe80::1%a/b]:80" }, ErrInvalidAddress},
		{"IPv4 with leading zeros", func(i *Instance) { i.Address = "010.0.0.1:80" }, ErrInvalidAddress},
		{"unspecified IPv4", func(i *Instance) { i.Address = "0.0.0.0:80" }, ErrInvalidAddress},
		{"unspecified IPv6", func(i *Instance) { i.Address = "[::]:80" }, ErrInvalidAddress},
		{"unspecified, mapped", func(i *Instance) { i.Address = "[::ffff:0.0.0.0]:80" }, ErrInvalidAddress},
		{"unspecified in a URL", func(i *Instance) { i.Address = "http://0.0.0.0:80/" }, ErrInvalidAddress},
		{"broadcast", func(i *Instance) { i.Address = "255.255.255.255:80" }, ErrInvalidAddress},
		{"multicast", func(i *Instance) { i.Address = "224.0.0.1:80" }, ErrInvalidAddress},
		{"IPv6 multicast", func(i *Instance) { i.Address = "[ff02::1]:80" }, ErrInvalidAddress},
		{"loopback, one host's", func(i *Instance) { i.Address = "127.0.0.1:80" }, nil},
		{"port zero-padded in a URL", func(i *Instance) { i.Address = "http://h:085/" }, ErrInvalidAddress},
		{"three numbers", func(i *Instance) { i.Address = "1.2.3:80" }, ErrInvalidAddress},
		{"octet over 255", func(i *Instance) { i.Address = "256.1.1.1:80" }, ErrInvalidAddress},
		{"a number", func(i *Instance) { i.Address = "4294967295:80" }, ErrInvalidAddress},
		{"a hex number", func(i *Instance) { i.Address = "0x7f000001:80" }, ErrInvalidAddress},
		{"digits in a name", func(i *Instance) { i.Address = "123.example.com:80" }, nil},
		{"bad status", func(i *Instance) { i.Status = "up" }, ErrInvalid},
		{"bad transport", func(i *Instance) { i.Transport = "GRPC" }, ErrInvalid},
	}
	for _, tt := range tests {
		in := validInstance()
		tt.mutate(&in)
		err := in.Validate()
		if tt.want == nil {
			if err != nil {
				t.Errorf("%s: unexpected error %v", tt.name, err)
			}
			continue
		}
		if !errors.Is(err, tt.want) || !errors.Is(err, ErrInvalid) {
			t.Errorf("%s: got %v, want %v", tt.name, err, tt.want)
		}
	}
}

// A stored value with a control character in a metadata value or a host
// name DNS cannot carry (written by another or an older writer) is still
// read: only writers refuse them.
func TestUnmarshalInstanceKeepsStoredControlCharacters(t *testing.T) {
	in := validInstance()
	in.Metadata = map[string]string{"note": "two\nlines"}
	in.Address = strings.Repeat("h", 64) + ":80"
	b, err := json.Marshal(in)
	if err != nil {
		t.Fatal(err)
	}
	out, err := UnmarshalInstance(b)
	if err != nil || out.Metadata["note"] != "two\nlines" {
		t.Fatalf("UnmarshalInstance: %+v, %v", out.Metadata, err)
	}
	if err := in.Validate(); !errors.Is(err, ErrInvalidAddress) {
		t.Fatalf("a writer accepts it: %v", err)
	}
	in.Address = "h:80"
	if err := in.Validate(); !errors.Is(err, ErrInvalidMetadata) {
		t.Fatalf("a writer accepts it: %v", err)
	}
}

func TestUnmarshalInstanceRejects(t *testing.T) {
	for _, s := range []string{``, `{`, `[]`, `{"namespace":"prod"}`, `{} {}`, `"x"`} {
		if _, err := UnmarshalInstance([]byte(s)); err == nil {
			t.Errorf("UnmarshalInstance(%q) accepted", s)
		}
	}
}

func FuzzUnmarshalInstance(f *testing.F) {
	b, _ := json.Marshal(validInstance())
	f.Add(b)
	f.Add([]byte(`{"namespace":"a","component":"b","endpoint":"c","id":"0000000000000001","address":"h:1"}`))
	f.Add([]byte(`{"metadata":{"a":1}}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		in, err := UnmarshalInstance(data)
		if err != nil {
			return
		}
		// Whatever decodes is valid and survives a round trip.
		if err := in.ValidateWith(1 << 20); err != nil {
			t.Fatalf("decoded invalid instance: %v", err)
		}
		again, err := json.Marshal(in)
		if err != nil {
			t.Fatal(err)
		}
		back, err := UnmarshalInstance(again)
		if err != nil || !back.Equal(in) {
			t.Fatalf("round trip of %s: %+v, %v", again, back, err)
		}
	})
}

func FuzzValidateAddress(f *testing.F) {
	for _, s := range []string{"h:1", "[::1]:80", "nats://x:4222", "x", ":80", "h:99999"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		if err := ValidateAddress(s); err != nil && !errors.Is(err, ErrInvalidAddress) {
			t.Fatalf("error %v is not ErrInvalidAddress", err)
		}
	})
}

// TestRoutingWarnings: each routing metadata value DNS and xDS cannot
// read gets a warning naming it; readable or absent ones get none.
func TestRoutingWarnings(t *testing.T) {
	in := validInstance()
	in.Metadata = map[string]string{MetaWeight: "70000", MetaPriority: "+1", MetaLBPolicy: "random", "zone": "a"}
	if got := in.RoutingWarnings(); len(got) != 3 {
		t.Fatalf("RoutingWarnings = %q, want one per unreadable key", got)
	}
	in.Metadata = map[string]string{MetaWeight: "0", MetaPriority: "65535", MetaLBPolicy: "least_request"}
	if got := in.RoutingWarnings(); got != nil {
		t.Fatalf("RoutingWarnings of readable values = %q", got)
	}
	if v, ok := Uint16Meta(nil, MetaWeight, DefaultWeight); v != DefaultWeight || !ok {
		t.Fatalf("Uint16Meta of an absent key = %d, %v", v, ok)
	}
}
