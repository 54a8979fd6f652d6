package hostport

import (
	"strings"
	"testing"
)

func TestCheck(t *testing.T) {
	for addr, want := range map[string]string{
		"127.0.0.1:9379": "", ":9379": "", "[::1]:0": "", "localhost:65535": "",
		"unix:///x":           "is a Unix socket: Unix sockets are not supported here; give host:port",
		"unixs://h:1":         "Unix sockets are not supported",
		"/run/beacon.sock":    "is a socket path",
		"http://127.0.0.1:80": "is a URL: give host:port, without http://",
		"9379":                "is a bare port: give host:port (:9379 for every interface, 127.0.0.1:9379 for this machine only)",
		"nope":                "must be host:port (port 0-65535)",
		"":                    "must be host:port",
		"127.0.0.1:99999":     `port "99999" is not a number from 0 to 65535`,
		"127.0.0.1:http":      `port "http" is not a number`,
		"a b:1":               `host "a b" is not a host name or IP address`,
	} {
		err := Check(addr)
		if want == "" {
			if err != nil {
				t.Errorf("Check(%q) = %v", addr, err)
			}
			continue
		}
		if err == nil || !strings.Contains(err.Error(), want) {
			t.Errorf("Check(%q) = %v, want %q", addr, err, want)
		}
	}
}

func FuzzCheck(f *testing.F) {
	for _, s := range []string{"127.0.0.1:9379", "unix:///x", "9379", "[::1]:80", "a:b:c"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, addr string) {
		if err := Check(addr); err == nil && !strings.Contains(addr, ":") {
			t.Fatalf("Check(%q) accepted an address without a port", addr)
		}
	})
}
