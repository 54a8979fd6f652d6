package server

import (
	"context"
	"fmt"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/etcdtest"
)

// TestFailedStartLeavesNothing: bad input and a port in use stop a first
// start before etcd writes to the data directory, and a first start that
// fails later (its cluster never forms) removes what it wrote, keeping
// whatever the directory held before; a directory that holds a member is
// never touched.
func TestFailedStartLeavesNothing(t *testing.T) {
	freeURL := func() string {
		p, err := etcdtest.FreePort()
		if err != nil {
			t.Fatal(err)
		}
		return fmt.Sprintf("http://127.0.0.1:%d", p)
	}
	t.Run("peer port in use", func(t *testing.T) {
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			t.Fatal(err)
		}
		defer ln.Close()
		cfg := testConfig(t)
		cfg.DataDir = filepath.Join(t.TempDir(), "beacon.data")
		cfg.ListenPeerURLs = []string{"http://" + ln.Addr().String()}
		err = startErr(t, cfg)
		if !strings.Contains(err.Error(), "Config.ListenPeerURLs") || !strings.Contains(err.Error(), "in use") {
			t.Fatalf("error %q does not name the peer port in use", err)
		}
		assertAbsent(t, cfg.DataDir)
	})
	t.Run("initial cluster without this member", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.DataDir = filepath.Join(t.TempDir(), "beacon.data")
		cfg.InitialCluster = "other=" + freeURL()
		err := startErr(t, cfg)
		if !strings.Contains(err.Error(), "Config.InitialCluster") || !strings.Contains(err.Error(), "does not name this member") {
			t.Fatalf("error %q", err)
		}
		assertAbsent(t, cfg.DataDir)
	})
	t.Run("initial cluster with other peer URLs", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.InitialCluster = DefaultName + "=" + freeURL()
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "make them the same") {
			t.Fatalf("Validate = %v", err)
		}
	})
	t.Run("unparsable initial cluster", func(t *testing.T) {
		cfg := testConfig(t)
		cfg.InitialCluster = "a=b=c"
		if err := cfg.Validate(); err == nil || !strings.Contains(err.Error(), "Config.InitialCluster") {
			t.Fatalf("Validate = %v", err)
		}
	})
	t.Run("cluster that never forms", func(t *testing.T) {
		for _, existed := range []bool{false, true} {
			cfg := testConfig(t)
			cfg.DataDir = filepath.Join(t.TempDir(), "beacon.data")
			if existed {
				if err := os.MkdirAll(cfg.DataDir, 0o700); err != nil {
					t.Fatal(err)
				}
				if err := os.WriteFile(filepath.Join(cfg.DataDir, "keep.txt"), []byte("mine"), 0o600); err != nil {
					t.Fatal(err)
				}
			}
			// Two members, the other never starts: no quorum, never ready.
			cfg.InitialCluster = DefaultName + "=" + cfg.ListenPeerURLs[0] + ",other=" + freeURL()
			if os.Getenv("BEACON_TEST_LOG") != "" {
				cfg.Logger = slog.New(slog.NewTextHandler(os.Stderr, nil))
			}
			s, err := New(cfg)
			if err != nil {
				t.Fatal(err)
			}
			ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
			err = s.Start(ctx)
			cancel()
			if err == nil {
				_ = s.Close()
				t.Fatal("a member without quorum started")
			}
			if !existed {
				assertAbsent(t, cfg.DataDir)
				continue
			}
			entries, err := os.ReadDir(cfg.DataDir)
			if err != nil || len(entries) != 1 || entries[0].Name() != "keep.txt" {
				t.Fatalf("existing data dir after a failed first start: %v %v", entries, err)
			}
		}
	})
	t.Run("existing member is never touched", func(t *testing.T) {
		cfg := testConfig(t)
		s := startServer(t, cfg)
		if err := s.Close(); err != nil {
			t.Fatal(err)
		}
		before := listTree(t, cfg.DataDir)
		ctx, cancel := context.WithCancel(context.Background())
		cancel() // the restart fails at once
		s2, err := New(cfg)
		if err != nil {
			t.Fatal(err)
		}
		if err := s2.Start(ctx); err == nil {
			_ = s2.Close()
			t.Fatal("Start with a cancelled context succeeded")
		}
		if after := listTree(t, filepath.Join(cfg.DataDir, "member")); len(after) == 0 || len(before) == 0 {
			t.Fatalf("member data removed by a failed restart: before %v, after %v", before, after)
		}
	})
}

func assertAbsent(t *testing.T, dir string) {
	t.Helper()
	if _, err := os.Stat(dir); !os.IsNotExist(err) {
		t.Fatalf("%s exists after a failed first start (%v): %v", dir, err, listTree(t, dir))
	}
}

func listTree(t *testing.T, dir string) []string {
	t.Helper()
	var out []string
	_ = filepath.Walk(dir, func(p string, _ os.FileInfo, err error) error {
		if err == nil {
			out = append(out, p)
		}
		return nil
	})
	return out
}

// TestBannerNamesReachableURLs: listening on every interface, the banner
// tells clients the advertised URLs and a reachable HTTP address, not
// 0.0.0.0.
func TestBannerNamesReachableURLs(t *testing.T) {
	cfg := testConfig(t)
	port, err := etcdtest.FreePort()
	if err != nil {
		t.Fatal(err)
	}
	cfg.ListenClientURLs = []string{fmt.Sprintf("http://0.0.0.0:%d", port)}
	cfg.AdvertiseClientURLs = []string{fmt.Sprintf("http://127.0.0.1:%d", port)}
	cfg.HTTPAddr = "0.0.0.0:0"
	cfg.DNS.Addr = "0.0.0.0:0"
	s := startServer(t, cfg)
	banner := s.Banner()
	for _, want := range []string{fmt.Sprintf("etcdctl --endpoints=http://127.0.0.1:%d ", port), "on every interface, e.g. http://127.0.0.1:",
		"(dig @127.0.0.1 -p "} {
		if !strings.Contains(banner, want) {
			t.Errorf("banner lacks %q:\n%s", want, banner)
		}
	}
}
