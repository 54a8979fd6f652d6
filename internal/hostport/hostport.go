// Package hostport checks the host:port addresses Beacon listens on and
// says, when one is not, what was given instead (a URL, a Unix socket, a
// bare port), rather than the standard library's "missing port in
// address" or a port "///x" that "is not a number".
package hostport

import (
	"fmt"
	"net"
	"strconv"
	"strings"
)

// Check returns nil if addr is host:port with a port from 0 to 65535
// (the host may be empty: every interface), else what is wrong with it,
// as a phrase to follow the flag's name: "must be host:port ...".
func Check(addr string) error {
	if scheme, _, ok := strings.Cut(addr, "://"); ok {
		if strings.HasPrefix(strings.ToLower(scheme), "unix") {
			return fmt.Errorf("is a Unix socket: Unix sockets are not supported here; give host:port")
		}
		return fmt.Errorf("is a URL: give host:port, without %s://", scheme)
	}
	if strings.HasPrefix(addr, "/") || strings.HasPrefix(addr, "@") {
		return fmt.Errorf("is a socket path: Unix sockets are not supported here; give host:port")
	}
	host, port, err := net.SplitHostPort(addr)
	if err != nil {
		if _, perr := strconv.ParseUint(addr, 10, 16); perr == nil {
			return fmt.Errorf("is a bare port: give host:port (:%s for every interface, 127.0.0.1:%s for this machine only)", addr, addr)
		}
		return fmt.Errorf("must be host:port (port 0-65535)")
	}
	if strings.ContainsAny(host, " /") {
		return fmt.Errorf("must be host:port: host %q is not a host name or IP address", host)
	}
	if n, err := strconv.ParseUint(port, 10, 16); err != nil || n > 65535 {
		return fmt.Errorf("must be host:port: port %q is not a number from 0 to 65535", port)
	}
	return nil
}
