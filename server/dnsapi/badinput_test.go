package dnsapi

import (
	"encoding/binary"
	"fmt"
	"io"
	"math/rand/v2"
	"net"
	"runtime"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/miekg/dns"
	"github.com/prometheus/client_golang/prometheus"
)

// raw sends pkt over UDP and returns the reply, or nil if none came within
// wait (for packets a server must drop).
func raw(t *testing.T, addr string, pkt []byte, wait time.Duration) *dns.Msg {
	t.Helper()
	return exchangeRaw(t, "udp", addr, pkt, wait)
}

// rawTCP sends pkt over TCP (with its length prefix) and returns the
// reply, or nil if the server sent none within wait.
func rawTCP(t *testing.T, addr string, pkt []byte, wait time.Duration) *dns.Msg {
	t.Helper()
	return exchangeRaw(t, "tcp", addr, pkt, wait)
}

// exchangeRaw sends pkt to addr over network (udp, or tcp with its length
// prefix) and returns the reply, or nil if none came within wait.
func exchangeRaw(t *testing.T, network, addr string, pkt []byte, wait time.Duration) *dns.Msg {
	t.Helper()
	c, err := net.Dial(network, addr)
	if err != nil {
		t.Fatal(err)
	}
	defer c.Close()
	if network == "tcp" {
		pkt = append(binary.BigEndian.AppendUint16(nil, uint16(len(pkt))), pkt...)
	}
	if _, err := c.Write(pkt); err != nil {
		t.Fatal(err)
	}
	_ = c.SetReadDeadline(time.Now().Add(wait))
	var reply []byte
	if network == "tcp" {
		var n [2]byte
		if _, err := io.ReadFull(c, n[:]); err != nil {
			return nil
		}
		reply = make([]byte, binary.BigEndian.Uint16(n[:]))
		if _, err := io.ReadFull(c, reply); err != nil {
			t.Fatalf("reply cut short: %v", err)
		}
	} else {
		buf := make([]byte, 65535)
		n, err := c.Read(buf)
		if err != nil {
			return nil
		}
		reply = buf[:n]
	}
	m := new(dns.Msg)
	if err := m.Unpack(reply); err != nil {
		t.Fatalf("reply does not unpack: %v", err)
	}
	return m
}

func packed(t *testing.T, m *dns.Msg) []byte {
	t.Helper()
	b, err := m.Pack()
	if err != nil {
		t.Fatal(err)
	}
	return b
}

func TestBadInput(t *testing.T) {
	t.Parallel()
	_, _, addr := fixture(t)
	alive := func(after string) {
		t.Helper()
		if r := query(t, addr, "udp", "web.api.prod.beacon.", dns.TypeA, 0); r.Rcode != dns.RcodeSuccess || len(r.Answer) != 2 {
			t.Fatalf("after %s: the server answers %v", after, r)
		}
	}
	q := func(name string, qtype uint16) *dns.Msg {
		m := new(dns.Msg)
		m.SetQuestion(name, qtype)
		return m
	}

	// Garbage and packets that are not queries: no crash, and the server
	// keeps answering. (A reply may or may not come; none is waited for
	// longer than a round trip.)
	for i, pkt := range [][]byte{
		nil, {0}, []byte("hello"), make([]byte, 11), make([]byte, 12),
		{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0xc0, 12, 0, 1, 0, 1},   // compression pointer loop
		{0, 1, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 63, 'a'},                // label past the end
		{0, 1, 0, 0, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff}, // counts with no records
	} {
		raw(t, addr, pkt, 200*time.Millisecond)
		alive(fmt.Sprintf("garbage packet %d", i))
	}
	for i := range 50 {
		pkt := make([]byte, rand.IntN(600))
		for j := range pkt {
			pkt[j] = byte(rand.IntN(256))
		}
		if len(pkt) > 2 {
			pkt[2] &^= 0x80 // a query, so that a reply may come
		}
		raw(t, addr, pkt, 50*time.Millisecond)
		_ = i
	}
	alive("random packets")

	// A response sent to the server is dropped (no reflection loop).
	resp := q("web.api.prod.beacon.", dns.TypeA)
	resp.Response = true
	if r := raw(t, addr, packed(t, resp), 300*time.Millisecond); r != nil {
		t.Errorf("a response was answered: %v", r)
	}

	for _, tc := range []struct {
		what  string
		m     *dns.Msg
		rcode int
	}{
		{"two questions", func() *dns.Msg {
			m := q("web.api.prod.beacon.", dns.TypeA)
			m.Question = append(m.Question, m.Question[0])
			return m
		}(), dns.RcodeFormatError},
		{"no question", func() *dns.Msg { m := q("x.", dns.TypeA); m.Question = nil; return m }(), dns.RcodeFormatError},
		{"NOTIFY", func() *dns.Msg { m := q("beacon.", dns.TypeSOA); m.Opcode = dns.OpcodeNotify; return m }(), dns.RcodeNotImplemented},
		{"UPDATE", func() *dns.Msg { m := q("beacon.", dns.TypeSOA); m.Opcode = dns.OpcodeUpdate; return m }(), dns.RcodeNotImplemented},
		{"ANY class: answered as IN", func() *dns.Msg {
			m := q("web.api.prod.beacon.", dns.TypeA)
			m.Question[0].Qclass = dns.ClassANY
			return m
		}(), dns.RcodeSuccess},
		{"CHAOS class", func() *dns.Msg { m := q("version.bind.", dns.TypeTXT); m.Question[0].Qclass = dns.ClassCHAOS; return m }(), dns.RcodeRefused},
		{"EDNS version 1", func() *dns.Msg {
			m := q("web.api.prod.beacon.", dns.TypeA)
			m.SetEdns0(1232, false)
			m.IsEdns0().SetVersion(1)
			return m
		}(), dns.RcodeBadVers},
		{"two OPT records", func() *dns.Msg {
			m := q("web.api.prod.beacon.", dns.TypeA)
			m.SetEdns0(1232, false)
			m.Extra = append(m.Extra, m.Extra[0])
			return m
		}(), dns.RcodeFormatError},
		{"unknown type", q("web.api.prod.beacon.", 65280), dns.RcodeSuccess},
		{"type 0", q("web.api.prod.beacon.", 0), dns.RcodeSuccess},
		{"longest name", q(strings.Repeat(strings.Repeat("a", 63)+".", 3)+strings.Repeat("b", 54)+".beacon.", dns.TypeA), dns.RcodeNameError},
		{"longest name outside", q(strings.Repeat(strings.Repeat("a", 63)+".", 3)+strings.Repeat("b", 61)+".", dns.TypeA), dns.RcodeRefused},
		{"escaped dot", q(`web\.api.prod.beacon.`, dns.TypeA), dns.RcodeNameError},
		{"binary label", q("\\000\\255.api.prod.beacon.", dns.TypeA), dns.RcodeNameError},
		{"ANY", q("web.api.prod.beacon.", dns.TypeANY), dns.RcodeSuccess},
	} {
		r := raw(t, addr, packed(t, tc.m), 5*time.Second)
		if r == nil {
			t.Errorf("%s: no reply", tc.what)
			continue
		}
		if r.Rcode != tc.rcode || r.Id != tc.m.Id {
			t.Errorf("%s: rcode %s id %d, want %s id %d", tc.what, dns.RcodeToString[r.Rcode], r.Id, dns.RcodeToString[tc.rcode], tc.m.Id)
		}
	}
	alive("malformed queries")
}

// A bounded flood of valid, absent, out-of-zone and malformed queries from
// several senders: the server answers throughout, counts them, and its
// memory and goroutines do not grow with the flood.
func TestFlood(t *testing.T) {
	t.Parallel()
	r := memRegistry(t)
	register(t, r, testInstance("web", "10.0.0.1:80"))
	metrics := prometheus.NewRegistry()
	s, addr := startDNS(t, r, Config{Metrics: metrics})
	waitView(t, s, "the instance", func() bool { return s.Ready() && s.view.Load().zone.instances == 1 })

	var before runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	goroutines := runtime.NumGoroutine()

	const senders, perSender = 8, 2500
	names := []string{"web.api.prod.beacon.", "nope.api.prod.beacon.", "example.com.", "WEB.API.PROD.BEACON.", strings.Repeat("x", 63) + ".beacon."}
	var wg sync.WaitGroup
	var mu sync.Mutex
	answered := 0
	for i := range senders {
		wg.Add(1)
		go func() {
			defer wg.Done()
			c, err := net.Dial("udp", addr)
			if err != nil {
				t.Error(err)
				return
			}
			defer c.Close()
			got := 0
			buf := make([]byte, 2048)
			// Reads run in this goroutine after each window of writes, so
			// the socket buffer never overflows silently.
			for j := 0; j < perSender; j += 50 {
				for k := range 50 {
					m := new(dns.Msg)
					m.SetQuestion(names[(i+j+k)%len(names)], []uint16{dns.TypeA, dns.TypeSRV, dns.TypeANY, 65280}[(j+k)%4])
					m.Id = uint16(k)
					b, _ := m.Pack()
					if k%10 == 9 {
						binary.BigEndian.PutUint16(b[4:], 5) // claims 5 questions: malformed
					}
					if _, err := c.Write(b); err != nil {
						t.Error(err)
						return
					}
				}
				_ = c.SetReadDeadline(time.Now().Add(2 * time.Second))
				for range 50 {
					if _, err := c.Read(buf); err != nil {
						break // a reply lost under load ends the window
					}
					got++
				}
			}
			mu.Lock()
			answered += got
			mu.Unlock()
		}()
	}
	wg.Wait()
	if answered < senders*perSender/2 {
		t.Errorf("%d of %d queries answered during the flood", answered, senders*perSender)
	}
	if r := query(t, addr, "udp", "web.api.prod.beacon.", dns.TypeA, 0); r.Rcode != dns.RcodeSuccess {
		t.Fatalf("after the flood: %v", r)
	}
	var after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&after)
	if grew := int64(after.HeapAlloc) - int64(before.HeapAlloc); grew > 32<<20 {
		t.Errorf("heap grew by %d MiB over a flood of %d queries", grew>>20, senders*perSender)
	}
	if n := runtime.NumGoroutine(); n > goroutines+senders+50 {
		t.Errorf("%d goroutines after the flood, %d before", n, goroutines)
	}
	mfs, err := metrics.Gather()
	if err != nil {
		t.Fatal(err)
	}
	total := 0.0
	for _, mf := range mfs {
		if mf.GetName() == "beacon_dns_queries_total" {
			for _, m := range mf.GetMetric() {
				total += m.GetCounter().GetValue()
			}
		}
	}
	if total < float64(answered) {
		t.Errorf("beacon_dns_queries_total = %v, below the %d answers received", total, answered)
	}
	t.Logf("flood: %d of %d answered; heap %d -> %d KiB", answered, senders*perSender, before.HeapAlloc>>10, after.HeapAlloc>>10)
}
