package proxy

import (
	"context"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// Loop detection has two layers. Directly: an endpoint whose address is
// this proxy's own listener (or one of Config.SelfAddrs) is never used.
// Indirectly: every request the proxy forwards carries the gRPC metadata
// key viaKey with this proxy's random ID appended; a request that arrives
// already carrying the ID has gone round a loop (proxy A -> proxy B -> A)
// and is refused, and the endpoint that sent it back is excluded.
const (
	viaKey = "beacon-proxy-via"
	// maxHops refuses requests that passed through this many proxies.
	maxHops = 8
	// loopMessage starts the status message of a refused looping request.
	loopMessage = "proxy: forwarding loop detected"
)

// selfMatcher tells whether a host:port is this proxy.
type selfMatcher struct {
	port  string
	ips   map[string]bool // addresses that reach the listener at port
	exact map[string]bool // extra host:port entries (SelfAddrs)
}

// newSelfMatcher describes the listener address and extra self addresses.
func newSelfMatcher(listen net.Addr, extra []string) *selfMatcher {
	m := &selfMatcher{ips: map[string]bool{}, exact: map[string]bool{}}
	if tcp, ok := listen.(*net.TCPAddr); ok {
		m.port = strconv.Itoa(tcp.Port)
		switch {
		case tcp.IP == nil || tcp.IP.IsUnspecified():
			// Listening on every interface: any local address is self.
			m.addLoopback()
			if addrs, err := net.InterfaceAddrs(); err == nil {
				for _, a := range addrs {
					if ipn, ok := a.(*net.IPNet); ok {
						m.ips[ipn.IP.String()] = true
					}
				}
			}
		case tcp.IP.IsLoopback():
			m.addLoopback()
			m.ips[tcp.IP.String()] = true
		default:
			m.ips[tcp.IP.String()] = true
		}
	}
	for _, s := range extra {
		if u, err := url.Parse(s); err == nil && u.Host != "" {
			s = u.Host
		}
		if host, port, err := net.SplitHostPort(s); err == nil {
			m.exact[canonicalHostPort(host, port)] = true
		}
	}
	return m
}

func (m *selfMatcher) addLoopback() {
	m.ips["127.0.0.1"] = true
	m.ips["::1"] = true
	m.ips["localhost"] = true
}

func canonicalHostPort(host, port string) string {
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if ip := net.ParseIP(host); ip != nil {
		host = ip.String()
	}
	return net.JoinHostPort(host, port)
}

// isSelf reports whether hostport reaches this proxy. Host names are
// resolved (bounded by ctx).
func (m *selfMatcher) isSelf(ctx context.Context, hostport string) bool {
	host, port, err := net.SplitHostPort(hostport)
	if err != nil {
		return false
	}
	if m.exact[canonicalHostPort(host, port)] {
		return true
	}
	if port != m.port {
		return false
	}
	host = strings.ToLower(strings.TrimSuffix(host, "."))
	if ip := net.ParseIP(host); ip != nil {
		return m.ips[ip.String()] || (ip.IsLoopback() && m.ips["127.0.0.1"])
	}
	if m.ips[host] {
		return true
	}
	ctx, cancel := context.WithTimeout(ctx, time.Second)
	defer cancel()
	addrs, err := net.DefaultResolver.LookupIPAddr(ctx, host)
	if err != nil {
		return false
	}
	for _, a := range addrs {
		if m.ips[a.IP.String()] || (a.IP.IsLoopback() && m.ips["127.0.0.1"]) {
			return true
		}
	}
	return false
}
