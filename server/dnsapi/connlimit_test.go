package dnsapi

import (
	"errors"
	"net"
	"testing"
	"time"

	"github.com/miekg/dns"
)

// TestTCPConnsPerClient: one client address holds at most
// MaxTCPConnsPerClient DNS-over-TCP connections; one past it is closed at
// once, and other clients are still answered. One client holding 256
// connections (a query every 1.5 s keeps each open) denied DNS over TCP to
// everyone else.
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
	for i := range 2 {
		if err := ask(dial("127.0.0.2")); err != nil {
			t.Fatalf("connection %d of 127.0.0.2: %v", i+1, err)
		}
	}
	// The third is closed by the server: its query gets no answer.
	if err := ask(dial("127.0.0.2")); err == nil {
		t.Fatal("a 3rd connection of 127.0.0.2 was answered; want it closed")
	} else if ne := (net.Error)(nil); errors.As(err, &ne) && ne.Timeout() {
		t.Fatalf("a 3rd connection of 127.0.0.2: %v; want it closed at once, not held", err)
	}
	if err := ask(dial("127.0.0.3")); err != nil {
		t.Fatalf("127.0.0.3 while 127.0.0.2 is at its bound: %v", err)
	}
}
