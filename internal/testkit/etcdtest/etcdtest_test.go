package etcdtest

import (
	"context"
	"testing"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
)

func TestServerVariants(t *testing.T) {
	for _, tc := range []struct {
		name string
		opts Options
	}{
		{"plain", Options{}},
		{"tls", Options{TLS: true}},
		{"auth", Options{User: "beacon", Password: "s3cret"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			s := Start(t, tc.opts)
			cli := s.Client(t)
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			if _, err := cli.Put(ctx, "k", "v"); err != nil {
				t.Fatal(err)
			}
			if tc.opts.User != "" {
				cfg := s.ClientConfig()
				cfg.Username, cfg.Password = "", ""
				anon, err := clientv3.New(cfg)
				if err != nil {
					t.Fatal(err)
				}
				defer anon.Close()
				if _, err := anon.Put(ctx, "k", "v"); err == nil {
					t.Fatal("write without credentials accepted")
				}
			}
		})
	}
}

func TestRestartKeepsDataAndPorts(t *testing.T) {
	s := Start(t, Options{})
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	cli := s.Client(t)
	if _, err := cli.Put(ctx, "k", "v"); err != nil {
		t.Fatal(err)
	}
	s.Stop()
	if err := s.Restart(); err != nil {
		t.Fatal(err)
	}
	resp, err := cli.Get(ctx, "k") // the old client reconnects to the same port
	if err != nil || len(resp.Kvs) != 1 || string(resp.Kvs[0].Value) != "v" {
		t.Fatalf("after restart: %v, %v", resp, err)
	}
}

// TestFreePortUnique: ports handed out are never repeated, even when each
// is free again the moment it is returned.
func TestFreePortUnique(t *testing.T) {
	seen := map[int]bool{}
	for range 200 {
		p, err := FreePort()
		if err != nil {
			t.Fatal(err)
		}
		if seen[p] {
			t.Fatalf("port %d handed out twice", p)
		}
		seen[p] = true
	}
}
