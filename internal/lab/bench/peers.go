package bench

import (
	"context"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"
)

// Peers are third-party programs a scenario runs beside Beacon: etcd's
// benchmark tool and an etcd 3.7 binary (for `etcd grpc-proxy`). They are
// looked up like the tests' peers (internal/testkit/testpeer, which the shipped
// binary must not link): the path given by flag, else
// $BEACON_PEERS_DIR/bin (default: beacon-peers under the user cache
// directory, where .ci/build-peers builds), else PATH.

// PeersDirEnv names the directory holding the peers under bin/.
const PeersDirEnv = "BEACON_PEERS_DIR"

// PeersDir is $BEACON_PEERS_DIR, or beacon-peers under the user cache
// directory.
func PeersDir() string {
	if d := os.Getenv(PeersDirEnv); d != "" {
		return d
	}
	if d, err := os.UserCacheDir(); err == nil {
		return filepath.Join(d, "beacon-peers")
	}
	return filepath.Join(os.TempDir(), "beacon-peers")
}

// Peer describes a program a scenario needs.
type Peer struct {
	// Name of the binary ("benchmark", "etcd").
	Name string
	// What it is, for messages ("etcd's benchmark tool").
	What string
	// Flag that names its path ("--benchmark-bin").
	Flag string
	// Build says how to build it into PeersDir()/bin.
	Build string
	// Check, when set, tells whether a candidate is the right program
	// (for example the right etcd version); it returns why not.
	Check func(path string) error
}

// BenchmarkPeer is etcd's benchmark tool (tools/benchmark).
var BenchmarkPeer = Peer{
	Name: "benchmark", What: "etcd's benchmark tool", Flag: "--benchmark-bin",
	Build: "bash .ci/build-peers benchmark   (from a Beacon checkout)",
}

// EtcdPeer is an etcd 3.7 server binary, whose `etcd grpc-proxy start` is
// etcd's own proxy.
var EtcdPeer = Peer{
	Name: "etcd", What: "an etcd 3.7 binary (for etcd's grpc-proxy)", Flag: "--etcd-bin",
	Build: `go build -o "` + filepath.Join(PeersDir(), "bin", "etcd") + `" ./internal/lab/etcd   (from a Beacon checkout)`,
	Check: checkEtcd37,
}

// Find returns the peer's path: flagPath if set (it must be there), else
// the first fitting candidate in PeersDir()/bin and PATH. The error says
// where it looked and how to build it.
func (p Peer) Find(flagPath string) (string, error) {
	if flagPath != "" {
		path, err := exec.LookPath(flagPath)
		if err != nil {
			return "", fmt.Errorf("bench: %s %q: %w", p.Flag, flagPath, err)
		}
		if p.Check != nil {
			if err := p.Check(path); err != nil {
				return "", fmt.Errorf("bench: %s %q: %w", p.Flag, flagPath, err)
			}
		}
		return path, nil
	}
	var why []string
	for _, c := range []string{filepath.Join(PeersDir(), "bin", p.Name), p.Name} {
		path, err := exec.LookPath(c)
		if err != nil {
			continue
		}
		if p.Check != nil {
			if err := p.Check(path); err != nil {
				why = append(why, fmt.Sprintf("%s: %v", path, err))
				continue
			}
		}
		return path, nil
	}
	msg := fmt.Sprintf("bench: %s not found (looked in %s and PATH", p.What, filepath.Join(PeersDir(), "bin"))
	if len(why) > 0 {
		msg += "; " + strings.Join(why, "; ")
	}
	return "", errors.New(msg + "): build it with: " + p.Build + "; or give its path with " + p.Flag)
}

// checkEtcd37 accepts an etcd binary of version 3.7.
func checkEtcd37(path string) error {
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	out, err := exec.CommandContext(ctx, path, "--version").Output()
	if err != nil {
		return fmt.Errorf("%s --version: %w", path, err)
	}
	first, _, _ := strings.Cut(string(out), "\n")
	if !strings.HasPrefix(first, "etcd Version: 3.7.") {
		return fmt.Errorf("is %q, want etcd 3.7", strings.TrimSpace(first))
	}
	return nil
}
