package bench

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"time"

	"github.com/beaconplane/beacon/internal/lab/drill"
	"github.com/beaconplane/beacon/internal/lab/etcdproc"
)

// Networks of DrillConfig.Network.
const (
	DrillNetAuto     = "auto"     // netns when possible, else loopback
	DrillNetNetns    = "netns"    // members in network namespaces (root, iproute2)
	DrillNetLoopback = "loopback" // members on 127.0.0.1 (no partition drill)
)

// DrillLease is the name of the lease drills (drill.RunLease) among
// DrillConfig.Drills.
const DrillLease = "lease"

// DrillConfig configures `beacon bench drill`.
type DrillConfig struct {
	// Drills to run (drill.All when empty); DrillLease runs the lease
	// drills.
	Drills []string
	// LeaseTTLs are the TTLs the lease drills' keepers use besides 3 s
	// (asserted for follower faults) and registry.MinElectionTTL
	// (asserted for leader faults); FsyncDelay is their slow disk's delay
	// per WAL sync (0: the drill's default).
	LeaseTTLs  []time.Duration
	FsyncDelay time.Duration
	// Trials per drill; member-hang and partition run at least 2.
	Trials int
	// Sessions (steady registrants, one client each) and Watchers.
	Sessions, Watchers int
	// TTL of every session.
	TTL time.Duration
	// EtcdBin, when set, runs members from this etcd binary; otherwise
	// members are `beacon serve` nodes of Self, joined by a discovery
	// token.
	EtcdBin string
	// Expiry, when positive, also lets that many instances expire at once
	// in both lease layouts (Beacon's sessions: one lease per process, in
	// ExpiryProcesses processes; and one lease per instance) and measures
	// how fast etcd deletes them.
	Expiry, ExpiryProcesses int
	// Network is DrillNetAuto, DrillNetNetns or DrillNetLoopback.
	Network string
	// Dir keeps the members' data and logs ("": a temporary directory,
	// removed afterwards).
	Dir string
	// Self returns the command that runs this beacon binary with args
	// (serve nodes, victim registrants).
	Self func(args ...string) *exec.Cmd
	// Logger receives the registries' warnings (nil: none); Progress one
	// line per trial.
	Logger   *slog.Logger
	Progress io.Writer
}

// Validate checks the flags' values.
func (c DrillConfig) Validate() error {
	var errs []error
	if c.Trials < 1 || c.Trials > 1000 {
		errs = append(errs, fmt.Errorf("--trials %d: want 1 to 1000", c.Trials))
	}
	if c.Sessions < 1 || c.Sessions > 1000 {
		errs = append(errs, fmt.Errorf("--sessions %d: want 1 to 1000", c.Sessions))
	}
	if c.Watchers < 1 || c.Watchers > 100 {
		errs = append(errs, fmt.Errorf("--watchers %d: want 1 to 100", c.Watchers))
	}
	if c.TTL < 2*time.Second || c.TTL > time.Minute {
		errs = append(errs, fmt.Errorf("--ttl %v: want 2s to 1m (etcd's shortest lease is 2 s)", c.TTL))
	}
	if c.Expiry < 0 || c.Expiry > 1_000_000 {
		errs = append(errs, fmt.Errorf("--expiry %d: want 0 (skip) to 1000000", c.Expiry))
	}
	if c.Expiry > 0 && (c.ExpiryProcesses < 1 || c.ExpiryProcesses > c.Expiry) {
		errs = append(errs, fmt.Errorf("--expiry-processes %d: want 1 to --expiry (%d)", c.ExpiryProcesses, c.Expiry))
	}
	switch c.Network {
	case DrillNetAuto, DrillNetNetns, DrillNetLoopback:
	default:
		errs = append(errs, fmt.Errorf("--net %q: want auto, netns or loopback", c.Network))
	}
	for _, d := range c.Drills {
		if !slices.Contains(drill.All, d) && d != DrillLease {
			errs = append(errs, fmt.Errorf("--drills: unknown drill %q (want some of %v, %s)", d, drill.All, DrillLease))
		}
	}
	for _, t := range c.LeaseTTLs {
		if t < 2*time.Second || t > time.Minute || t%time.Second != 0 {
			errs = append(errs, fmt.Errorf("--lease-ttls %v: want whole seconds from 2s to 1m (etcd grants whole seconds, 2 s at least)", t))
		}
	}
	if c.FsyncDelay < 0 || c.FsyncDelay > 10*time.Second {
		errs = append(errs, fmt.Errorf("--fsync-delay %v: want 0 to 10s", c.FsyncDelay))
	}
	if c.EtcdBin != "" {
		if _, err := exec.LookPath(c.EtcdBin); err != nil {
			errs = append(errs, fmt.Errorf("--etcd-bin %q: %w", c.EtcdBin, err))
		}
	}
	if c.Dir != "" {
		if err := dirUsable(c.Dir); err != nil {
			errs = append(errs, fmt.Errorf("--dir %q: %w", c.Dir, err))
		}
	}
	return errors.Join(errs...)
}

// DrillReport is what RunDrill measured.
type DrillReport struct {
	Drills []drill.Result       `json:"drills"`
	Lease  []drill.LeaseResult  `json:"lease,omitempty"`
	Expiry []drill.ExpiryResult `json:"expiry,omitempty"`
}

// RunDrill runs the drills (and the expiry measurement) and returns their
// results. Members, registrants and watchers are real processes and
// clients; it cleans up every process and namespace it made, also when it
// fails.
func RunDrill(ctx context.Context, c DrillConfig) (DrillReport, error) {
	var rep DrillReport
	if err := c.Validate(); err != nil {
		return rep, err
	}
	network := func() (*etcdproc.Network, error) { return etcdproc.Loopback(), nil }
	switch c.Network {
	case DrillNetNetns:
		network = etcdproc.Netns
	case DrillNetAuto:
		if nw, err := etcdproc.Netns(); err == nil {
			nw.Close()
			network = etcdproc.Netns
		} else if c.Progress != nil {
			fmt.Fprintf(c.Progress, "members on loopback (the partition drill is skipped): %v\n", err)
		}
	}
	dir := c.Dir
	if dir == "" {
		d, err := os.MkdirTemp("", "beacon-drill-")
		if err != nil {
			return rep, err
		}
		defer os.RemoveAll(d)
		dir = d
	}
	var members etcdproc.Launcher = &drill.ServeNodes{Beacon: c.Self}
	if c.EtcdBin != "" {
		members = etcdproc.EtcdMembers{Bin: c.EtcdBin}
	}
	cfg := drill.Config{
		Members:    members,
		Network:    network,
		Dir:        dir,
		Registrant: func() *exec.Cmd { return c.Self("bench", "drill-registrant") },
		TTL:        c.TTL,
		Sessions:   c.Sessions,
		Watchers:   c.Watchers,
		Trials:     c.Trials,
		Log:        c.Logger,
		Progress:   c.Progress,
	}
	var err error
	others := slices.DeleteFunc(slices.Clone(c.Drills), func(d string) bool { return d == DrillLease })
	if len(others) > 0 || (len(c.Drills) == 0 && c.Expiry == 0) {
		if rep.Drills, err = drill.Run(ctx, cfg, others...); err != nil {
			return rep, err
		}
	}
	if slices.Contains(c.Drills, DrillLease) {
		if rep.Lease, err = drill.RunLease(ctx, c.leaseConfig(cfg)); err != nil {
			return rep, err
		}
	}
	if c.Expiry > 0 {
		rep.Expiry, err = drill.MeasureExpiry(ctx, cfg, c.Expiry, c.ExpiryProcesses)
	}
	return rep, err
}

// leaseConfig is the lease drills' configuration: members of --etcd-bin
// with fsync on (the slow-disk fault needs the slow-disk build, see
// internal/lab/etcd/slowdisk; another etcd skips it with the reason), else
// beacon serve nodes.
func (c DrillConfig) leaseConfig(cfg drill.Config) drill.LeaseConfig {
	members := cfg.Members
	if c.EtcdBin != "" {
		members = etcdproc.EtcdMembers{Bin: c.EtcdBin, FsyncDelay: true}
	}
	return drill.LeaseConfig{
		Members:    members,
		Network:    cfg.Network,
		Dir:        cfg.Dir,
		Beacon:     c.Self,
		ExtraTTLs:  c.LeaseTTLs,
		FsyncDelay: c.FsyncDelay,
		Log:        c.Logger,
		Progress:   c.Progress,
	}
}

// dirUsable reports why dir cannot hold the members' data: it, or the
// nearest of its parents that exists (the drill makes the rest), must be a
// directory this process can write in. It leaves nothing behind.
func dirUsable(dir string) error {
	p := filepath.Clean(dir)
	for {
		fi, err := os.Stat(p)
		if err == nil {
			if !fi.IsDir() {
				return fmt.Errorf("%s is not a directory", p)
			}
			f, err := os.CreateTemp(p, ".beacon-drill-check-")
			if err != nil {
				return fmt.Errorf("cannot write in %s: %w", p, errors.Unwrap(err))
			}
			name := f.Name()
			_ = f.Close()
			return os.Remove(name)
		}
		if !errors.Is(err, fs.ErrNotExist) {
			return err
		}
		parent := filepath.Dir(p)
		if parent == p {
			return err
		}
		p = parent
	}
}
