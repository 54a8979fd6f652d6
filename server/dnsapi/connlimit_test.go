package dnsapi

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestTCPConnsPerClient: one client address holds at most
// MaxTCPConnsPerClient DNS-over-TCP connections; a new one from it takes
// the place of the one idle longest (closed for it) — every process of a
// host shares its address, so a bound reached must not refuse the newcomer
// — and other clients are answered throughout. One client holding 256
// connections (a query every 1.5 s keeps each open) denied DNS over TCP to
// everyone else; and a refused newcomer would let one local process lock
// out the others.
func TestTCPConnsPerClient(t *testing.T) {
	r := memRegistry(t)
	s, addr := startDNS(t, r, Config{MaxTCPConns: 8, MaxTCPConnsPerClient: 2})
	waitView(t, s, "the first snapshot", func() bool { return s.Ready() })
	dial := func(src string) net.Conn {
		t.Helper()
		d := net.Dialer{LocalAddr: &net.TCPAddr{IP: net.ParseIP(src)}, Timeout: testDeadline}
		c, err := d.Dial("tcp", addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { _ = c.Close() })
		return c
	}
	ask := func(c net.Conn) error {
		co := &dns.Conn{Conn: c}
		m := new(dns.Msg)
		m.SetQuestion("x.beacon.", dns.TypeA)
		_ = c.SetDeadline(time.Now().Add(testDeadline))
		if err := co.WriteMsg(m); err != nil {
			return err
		}
		_, err := co.ReadMsg()
		return err
	}
	var first []net.Conn
	for i := range 2 {
		c := dial("127.0.0.2")
		if err := ask(c); err != nil {
			t.Fatalf("connection %d of 127.0.0.2: %v", i+1, err)
		}
		first = append(first, c)
	}
	// The second is asked again: the first is now the one idle longest.
	if err := ask(first[1]); err != nil {
		t.Fatal(err)
	}
	if err := ask(dial("127.0.0.2")); err != nil {
		t.Fatalf("a 3rd connection of 127.0.0.2: %v; want it answered", err)
	}
	// The one idle longest was closed for it; the other is answered.
	_ = first[0].SetReadDeadline(time.Now().Add(testDeadline))
	if _, err := first[0].Read(make([]byte, 1)); err == nil {
		t.Fatal("the connection idle longest was not closed")
	} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("the connection idle longest is still open: %v", err)
	}
	if err := ask(first[1]); err != nil {
		t.Fatalf("the connection asked last: %v", err)
	}
	if err := ask(dial("127.0.0.3")); err != nil {
		t.Fatalf("127.0.0.3 while 127.0.0.2 is at its bound: %v", err)
	}
}
