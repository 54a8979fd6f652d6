package dnsapi

import (
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/beaconplane/beacon"
	"github.com/miekg/dns"
)

// fuzzZone is a zone with every kind of name: IPv4, IPv6, hostname and URL
// addresses, metadata with escapes, a draining instance, several
// components.
func fuzzZone() *zone {
	ins := []beacon.Instance{
		{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a1", Address: "10.0.0.1:80", Metadata: map[string]string{"k": `v\"x`, "weight": "7"}},
		{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a2", Address: "[::1]:80"},
		{Namespace: "prod", Component: "api", Endpoint: "web", ID: "00000000000000a3", Address: "nats://Host.Example:4222/x"},
		{Namespace: "prod", Component: "api", Endpoint: "grpc", ID: "00000000000000a4", Address: "http://10.0.0.4/"},
		{Namespace: "prod", Component: "api", Endpoint: "grpc", ID: "00000000000000a5", Address: "10.0.0.5:81", Status: beacon.StatusDraining},
		{Namespace: "dev", Component: "db", Endpoint: "sql", ID: "00000000000000b1", Address: "10.0.1.1:5432"},
	}
	byComp := map[compID][]beacon.Instance{}
	for _, in := range ins {
		id := compID{in.Namespace, in.Component}
		byComp[id] = append(byComp[id], in)
	}
	z, _ := newZone(DefaultDomain, 5).with(7, byComp)
	return z
}

// FuzzSplitQName checks the name parser: a name is under the domain exactly
// when its last labels are the domain's, and rel is the lower-cased rest.
func FuzzSplitQName(f *testing.F) {
	for _, s := range []string{"beacon.", "web.api.prod.beacon.", "WEB.Api.prod.BEACON.", "a\\.beacon.", "a\\\\.beacon.",
		"x.beacon", "beacon.com.", ".", "", "..beacon.", `x\..beacon.`, `\000\255\..web.api.prod.beacon.`, `a\\..beacon.`, "xbeacon.", "_web._tcp.api.prod.beacon.", strings.Repeat("a.", 120) + "beacon."} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, q string) {
		rel, in := splitQName(q, DefaultDomain)
		// DNS compares ASCII case-insensitively; other bytes stay.
		lower := strings.Map(func(r rune) rune {
			if 'A' <= r && r <= 'Z' {
				return r + 'a' - 'A'
			}
			return r
		}, q)
		if !utf8.ValidString(q) {
			b := []byte(q)
			for i, c := range b {
				if 'A' <= c && c <= 'Z' {
					b[i] = c + 'a' - 'A'
				}
			}
			lower = string(b)
		}
		if !strings.HasSuffix(lower, ".") {
			lower += "."
		}
		if !in {
			if rel != "" {
				t.Fatalf("%q: outside the domain but rel %q", q, rel)
			}
			return
		}
		if rel == "" {
			if lower != DefaultDomain {
				t.Fatalf("%q: apex, but it is not the domain", q)
			}
			return
		}
		if rel+"."+DefaultDomain != lower {
			t.Fatalf("%q: rel %q does not rebuild the name", q, rel)
		}
		// miekg/dns splits escape-aware (the sentinel label shows a
		// trailing empty one).
		if slices.Contains(dns.SplitDomainName(rel+".x"), "") {
			t.Fatalf("%q: rel %q has an empty label", q, rel)
		}
		// Never a panic on lookup, and nothing with an escape is found.
		if n := fuzzZone().lookup(rel); n != nil && strings.Contains(rel, `\`) {
			t.Fatalf("%q: a name with an escape was found", q)
		}
	})
}

// FuzzAnswer feeds arbitrary packets to the answer builder: whatever
// unpacks gets a reply that packs, echoes the ID, fits the transport, and
// has a consistent rcode.
func FuzzAnswer(f *testing.F) {
	z := fuzzZone()
	a := &answerer{domain: DefaultDomain, ttl: 5, udpSize: DefaultUDPSize}
	for _, q := range []struct {
		name  string
		t     uint16
		edns  int
		class uint16
	}{
		{"web.api.prod.beacon.", dns.TypeSRV, 0, dns.ClassINET},
		{"WEB.api.prod.beacon.", dns.TypeA, 1232, dns.ClassINET},
		{"00000000000000a3.web.api.prod.beacon.", dns.TypeTXT, 4096, dns.ClassINET},
		{"api.prod.beacon.", dns.TypeANY, 0, dns.ClassANY},
		{"example.com.", dns.TypeA, 0, dns.ClassINET},
		{"beacon.", dns.TypeSOA, 512, dns.ClassCHAOS},
		{"x.beacon.", 65280, 0, dns.ClassINET},
	} {
		m := new(dns.Msg)
		m.SetQuestion(q.name, q.t)
		m.Question[0].Qclass = q.class
		if q.edns > 0 {
			m.SetEdns0(uint16(q.edns), true)
		}
		b, err := m.Pack()
		if err != nil {
			f.Fatal(err)
		}
		f.Add(b, true)
	}
	f.Add([]byte{0, 1, 0, 0, 0, 2, 0, 0, 0, 0, 0, 0}, false)
	f.Fuzz(func(t *testing.T, pkt []byte, udp bool) {
		req := new(dns.Msg)
		if err := req.Unpack(pkt); err != nil {
			return // the server answers FORMERR or drops it before the handler
		}
		for _, zz := range []*zone{z, nil} {
			m := a.answer(zz, req, udp)
			out, err := m.Pack()
			if err != nil {
				t.Fatalf("reply does not pack: %v\n%v", err, m)
			}
			if m.Id != req.Id || !m.Response {
				t.Fatalf("reply id %d response %v", m.Id, m.Response)
			}
			if udp && len(out) > DefaultUDPSize && len(m.Answer)+len(m.Ns) > 0 {
				// Compression may not be on for small messages, so
				// check the compressed size as sent.
				m.Compress = true
				if b, _ := m.Pack(); len(b) > DefaultUDPSize {
					t.Fatalf("UDP reply of %d bytes", len(b))
				}
			}
			if m.Rcode == dns.RcodeNameError && (len(m.Ns) != 1 || m.Ns[0].Header().Rrtype != dns.TypeSOA) {
				t.Fatalf("NXDOMAIN without SOA: %v", m)
			}
			if len(req.Question) == 1 {
				if _, in := splitQName(req.Question[0].Name, DefaultDomain); !in && m.Rcode == dns.RcodeSuccess {
					t.Fatalf("answered a name outside the domain: %v", m)
				}
			}
		}
	})
}

// FuzzBuildComponent builds views from arbitrary instances, in the default
// zone and in a long one (where long names do not fit): every answer packs
// and unpacks again (miekg/dns packs a name longer than 255 bytes that no
// client accepts), whatever the names, address and metadata.
func FuzzBuildComponent(f *testing.F) {
	f.Add("web", "10.0.0.1:80", "k", "v", "serving", false)
	f.Add("web", "host.example:1", "weight", "70000", "draining", false)
	f.Add("x", "nats://[::1]:4222/subj", "priority", "1", "", false)
	f.Add("x", "http://a_b.example/", strings.Repeat("k", 300), strings.Repeat(`\"`, 400), "", false)
	f.Add(strings.Repeat("e", 63), "10.0.0.1:80", "a=b", "`", "", true)
	f.Add("web", "10.0.0.1:80", "k", "v", "", true)
	f.Fuzz(func(t *testing.T, endpoint, addr, key, value, status string, long bool) {
		domain, comp := DefaultDomain, "api"
		if long {
			domain, comp = strings.Repeat("abcdefghi.", 14)+"z.", strings.Repeat("c", 63)
		}
		in := beacon.Instance{Namespace: "prod", Component: comp, Endpoint: endpoint, ID: "00000000000000a1",
			Address: addr, Metadata: map[string]string{key: value}, Status: beacon.Status(status), RegisteredAt: time.Unix(1, 0)}
		if in.Validate() != nil {
			return // the registry refuses it: never in a view
		}
		z, _ := newZone(domain, 5).with(1, map[compID][]beacon.Instance{{"prod", comp}: {in}})
		a := &answerer{domain: domain, ttl: 5, udpSize: DefaultUDPSize}
		compName := comp + ".prod." + domain
		for _, name := range []string{compName, endpoint + "." + compName, "_" + endpoint + "._tcp." + compName, in.ID + "." + endpoint + "." + compName} {
			if _, ok := dns.IsDomainName(name); !ok {
				continue // no client can ask it
			}
			for _, qt := range []uint16{dns.TypeA, dns.TypeAAAA, dns.TypeSRV, dns.TypeTXT, dns.TypeCNAME, dns.TypeANY} {
				req := new(dns.Msg)
				req.SetQuestion(name, qt)
				for _, udp := range []bool{true, false} {
					m := a.answer(z, req, udp)
					b, err := m.Pack()
					if err != nil {
						t.Fatalf("%s %s for %+v: %v", name, dns.TypeToString[qt], in, err)
					}
					if err := new(dns.Msg).Unpack(b); err != nil {
						t.Fatalf("%s %s for %+v: the answer does not unpack: %v", name, dns.TypeToString[qt], in, err)
					}
				}
			}
		}
	})
}

func TestConfigValidate(t *testing.T) {
	for _, tc := range []struct {
		cfg  Config
		want string
	}{
		{Config{}, ""},
		{Config{Domain: "svc.example.com"}, ""},
		{Config{Domain: "."}, "root zone"},
		{Config{Domain: "a..b"}, "label"},
		{Config{Domain: "a_b."}, "label"},
		{Config{TTL: 500 * time.Millisecond}, "dnsapi.Config.TTL"},
		{Config{TTL: 1500 * time.Millisecond}, "whole seconds"},
		{Config{TTL: 2 * time.Hour}, "dnsapi.Config.TTL"},
		{Config{UDPSize: 100}, "UDP size"},
		{Config{MaxTCPConns: -1}, "TCP"},
	} {
		err := tc.cfg.Validate()
		if (err == nil) != (tc.want == "") || (err != nil && !strings.Contains(err.Error(), tc.want)) {
			t.Errorf("%+v: %v, want %q", tc.cfg, err, tc.want)
		}
	}
}

// The last view is served for MaxStale after the watch went stale, and
// not after.
func TestStaleBound(t *testing.T) {
	z := fuzzZone()
	s := &Server{cfg: Config{MaxStale: time.Minute}}
	s.view.Store(&view{zone: z, staleSince: time.Now().Add(-30 * time.Second)})
	if s.current() != z {
		t.Error("stale for 30s of a 1m bound: not served")
	}
	s.view.Store(&view{zone: z, staleSince: time.Now().Add(-2 * time.Minute)})
	if s.current() != nil {
		t.Error("stale for 2m of a 1m bound: still served")
	}
	s.view.Store(&view{zone: z})
	if s.current() != z {
		t.Error("live view not served")
	}
	if fmt.Sprint((&Server{}).current()) != "<nil>" {
		t.Error("no view: something served")
	}
}

// FuzzSectionsComplete: the section walk never panics or reads past the
// packet, and every message miekg/dns packs holds its sections in full.
func FuzzSectionsComplete(f *testing.F) {
	q := new(dns.Msg)
	q.SetQuestion("web.api.prod.beacon.", dns.TypeSRV)
	q.SetEdns0(1232, false)
	b, err := q.Pack()
	if err != nil {
		f.Fatal(err)
	}
	f.Add(b)
	f.Add(b[:len(b)-1])
	f.Add([]byte{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1})
	f.Add([]byte{0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff})
	f.Fuzz(func(t *testing.T, pkt []byte) {
		if len(pkt) < headerSize {
			return
		}
		complete := sectionsComplete(pkt)
		want := len(pkt)
		if !complete {
			want = headerSize
		}
		if got := checkSections(pkt); len(got) != want {
			t.Fatalf("checkSections kept %d of %d bytes; sectionsComplete %v", len(got), len(pkt), complete)
		}
		m := new(dns.Msg)
		if m.Unpack(pkt) != nil {
			return
		}
		if out, err := m.Pack(); err == nil && !sectionsComplete(out) {
			t.Fatalf("a message miekg/dns packs is incomplete: % x", out)
		}
	})
}
