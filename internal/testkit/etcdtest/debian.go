package etcdtest

import (
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// StartDebianEtcd runs Debian's etcd (3.4, the etcd-server package) as a
// one-member cluster on loopback, with extra flags (--enable-v2=true for
// its v2 API), until the test ends, and returns its client URL once it
// answers /health. It is skipped, or failed under BEACON_REQUIRE_PEERS,
// when the binary is missing.
func StartDebianEtcd(tb testing.TB, extra ...string) string {
	tb.Helper()
	bin := testpeer.Binary(tb, "apt-get install -y etcd-server (Debian's etcd 3.4)", "/usr/bin/etcd")
	cport, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	pport, err := FreePort()
	if err != nil {
		tb.Fatal(err)
	}
	curl := "http://127.0.0.1:" + strconv.Itoa(cport)
	purl := "http://127.0.0.1:" + strconv.Itoa(pport)
	dir := tb.TempDir()
	args := append([]string{"--name", "debian", "--data-dir", filepath.Join(dir, "data"),
		"--listen-client-urls", curl, "--advertise-client-urls", curl,
		"--listen-peer-urls", purl, "--initial-advertise-peer-urls", purl,
		"--initial-cluster", "debian=" + purl, "--log-level", "error"}, extra...)
	cmd := testpeer.Command(bin, args...)
	logf, err := os.Create(filepath.Join(dir, "etcd.log"))
	if err != nil {
		tb.Fatal(err)
	}
	cmd.Stdout, cmd.Stderr = logf, logf
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	var waitErr error
	exited := make(chan struct{})
	go func() {
		waitErr = cmd.Wait()
		close(exited)
	}()
	tb.Cleanup(func() {
		_ = cmd.Process.Kill()
		<-exited
		_ = logf.Close()
	})
	hc := &http.Client{Timeout: time.Second}
	deadline := time.Now().Add(30 * time.Second)
	tick := time.NewTicker(20 * time.Millisecond)
	defer tick.Stop()
	for {
		select {
		case <-exited:
			b, _ := os.ReadFile(logf.Name())
			tb.Fatalf("Debian's etcd exited: %v\n%s", waitErr, b)
		case <-tick.C:
		}
		if resp, err := hc.Get(curl + "/health"); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return curl
			}
		}
		if time.Now().After(deadline) {
			tb.Fatalf("Debian's etcd at %s did not answer /health within 30s", curl)
		}
	}
}
