package server

import (
	"net/http"
	"strings"
	"testing"
	"time"
)

// TestPprof: --pprof serves Go's profiles on the HTTP address, and only
// then; the embedded etcd runs without fsync when asked.
func TestPprof(t *testing.T) {
	cfg := testConfig(t)
	cfg.EnablePprof = true
	cfg.UnsafeNoFsync = true
	cfg.Security.RequestTimeout = time.Second
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	if code, body := get(t, base+"/debug/pprof/"); code != http.StatusOK || !strings.Contains(body, "goroutine") {
		t.Fatalf("/debug/pprof/ with --pprof: %d %.200s", code, body)
	}
	if code, _ := get(t, base+"/debug/pprof/heap?debug=1"); code != http.StatusOK {
		t.Fatalf("/debug/pprof/heap: %d", code)
	}
	// A profile longer than the request timeout is not cut (an empty
	// reply: `go tool pprof` asks for 30 s, the default request timeout).
	start := time.Now()
	if code, body := get(t, base+"/debug/pprof/profile?seconds=2"); code != http.StatusOK || len(body) == 0 {
		t.Fatalf("a 2 s CPU profile with a 1 s request timeout: %d, %d bytes", code, len(body))
	}
	if took := time.Since(start); took < 2*time.Second {
		t.Fatalf("the 2 s profile answered after %v", took)
	}
	if !s.member.etcd.Config().UnsafeNoFsync {
		t.Error("UnsafeNoFsync not passed to etcd")
	}

	off := startServer(t, testConfig(t))
	if code, _ := get(t, off.Endpoints().HTTP+"/debug/pprof/"); code != http.StatusNotFound {
		t.Fatalf("/debug/pprof/ without --pprof: %d, want 404", code)
	}
}

// TestPprofUnderAuth: with etcd authentication on, the profiles (which
// show the command line, and cost the whole process) serve only members of
// etcd's root role; any authenticated user read them before.
func TestPprofUnderAuth(t *testing.T) {
	cfg := authConfig(t)
	cfg.EnablePprof = true
	s := startServer(t, cfg)
	base := s.Endpoints().HTTP
	grant(t, rootClient(t, s), "carol", "carol-pw", "readwrite /services/team-a/")
	for _, path := range []string{"/debug/pprof/", "/debug/pprof/cmdline", "/debug/pprof/heap?debug=1", "/debug/pprof/symbol", "/debug/pprof/trace?seconds=0.1"} {
		if r := (as{t: t, base: base}).do("GET", path, ""); r.code != http.StatusUnauthorized {
			t.Errorf("%s without credentials: %d %.200s", path, r.code, r.body)
		}
		r := as{t: t, base: base, auth: basic("carol", "carol-pw")}.do("GET", path, "")
		if r.code != http.StatusForbidden || !strings.Contains(r.body, "root") {
			t.Errorf("%s as carol (no root role): %d %.200s", path, r.code, r.body)
		}
		if r := (as{t: t, base: base, auth: basic("root", rootPassword)}).do("GET", path, ""); r.code != http.StatusOK {
			t.Errorf("%s as root: %d %.200s", path, r.code, r.body)
		}
	}
}
