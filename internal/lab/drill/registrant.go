package drill

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"strings"
	"syscall"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store/etcd"
)

// RegistrantEnv is set in the environment of a victim registrant child:
// the program it runs must call RegistrantMain (tests from TestMain,
// `beacon bench drill-registrant` in the binary).
const RegistrantEnv = "BEACON_DRILL_REGISTRANT"

// The child's settings.
const (
	envEndpoints = "BEACON_DRILL_ENDPOINTS"
	envNamespace = "BEACON_DRILL_NS"
	envTTL       = "BEACON_DRILL_TTL"
	envAddress   = "BEACON_DRILL_ADDR"
	envSilence   = "BEACON_DRILL_WATCH_SILENCE"
	envProbe     = "BEACON_DRILL_PROBE_TIMEOUT"
)

// IsRegistrant reports whether this process was started as a victim
// registrant.
func IsRegistrant() bool { return os.Getenv(RegistrantEnv) != "" }

// RegistrantMain is a victim registrant: it registers one instance with
// the settings its parent put in the environment, prints "id <ref>" and
// "ready", and keeps it alive until stdin closes (its parent is gone) or it
// is killed. It returns the process exit code.
func RegistrantMain(stdin io.Reader, stdout, stderr io.Writer) int {
	fail := func(err error) int {
		fmt.Fprintln(stderr, "drill registrant:", err)
		return 1
	}
	ttl, err := time.ParseDuration(os.Getenv(envTTL))
	if err != nil {
		return fail(err)
	}
	silence, _ := time.ParseDuration(os.Getenv(envSilence))
	probe, _ := time.ParseDuration(os.Getenv(envProbe))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	st, err := etcd.Open(ctx, etcd.Config{
		Endpoints:           strings.Split(os.Getenv(envEndpoints), ","),
		WatchSilenceTimeout: silence,
		ProbeTimeout:        probe,
		RequestTimeout:      ttl,
	})
	if err != nil {
		return fail(err)
	}
	defer st.Close()
	r, err := registry.New(st, registry.Config{LeaseTTL: ttl})
	if err != nil {
		return fail(err)
	}
	defer r.Close()
	reg, err := r.Register(ctx, beacon.Instance{Namespace: os.Getenv(envNamespace), Component: "victim", Endpoint: "rpc",
		Address: os.Getenv(envAddress), Transport: "tcp"})
	if err != nil {
		return fail(err)
	}
	fmt.Fprintln(stdout, "id", reg.Instance().Ref())
	fmt.Fprintln(stdout, "ready")
	_, _ = io.Copy(io.Discard, stdin)
	return 0
}

// victim is a registrant child.
type victim struct {
	cmd    *exec.Cmd
	stdin  io.WriteCloser
	id     string
	exited chan struct{}
}

// startVictim starts a registrant child and waits until it registered.
func (r *runner) startVictim(ctx context.Context, endpoints []string, ns string, n int) (*victim, error) {
	cmd := r.cfg.Registrant()
	cmd.Env = append(cmd.Environ(),
		RegistrantEnv+"=1",
		envEndpoints+"="+strings.Join(endpoints, ","),
		envNamespace+"="+ns,
		envTTL+"="+r.cfg.TTL.String(),
		envAddress+"="+fmt.Sprintf("10.66.%d.%d:7000", n/250, n%250+1),
		envSilence+"="+r.cfg.Store.WatchSilenceTimeout.String(),
		envProbe+"="+r.cfg.Store.ProbeTimeout.String(),
	)
	cmd.Stderr = os.Stderr
	cmd.SysProcAttr = &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
	stdin, err := cmd.StdinPipe()
	if err != nil {
		return nil, err
	}
	stdout, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start registrant: %w", err)
	}
	v := &victim{cmd: cmd, stdin: stdin, exited: make(chan struct{})}
	lines := make(chan string)
	go func() {
		defer close(lines)
		sc := bufio.NewScanner(stdout)
		for sc.Scan() {
			lines <- sc.Text()
		}
	}()
	go func() {
		_ = cmd.Wait()
		close(v.exited)
	}()
	deadline := time.NewTimer(30 * time.Second)
	defer deadline.Stop()
	for {
		select {
		case line, ok := <-lines:
			if !ok {
				v.kill()
				return nil, errors.New("registrant exited before it was ready")
			}
			if id, ok := strings.CutPrefix(line, "id "); ok {
				v.id = id
			}
			if line == "ready" {
				go func() {
					for range lines {
					}
				}()
				return v, nil
			}
		case <-deadline.C:
			v.kill()
			return nil, errors.New("registrant not ready within 30 s")
		case <-ctx.Done():
			v.kill()
			return nil, ctx.Err()
		}
	}
}

// kill kills the registrant with SIGKILL (no deregistration, no revoke)
// and waits for its exit.
func (v *victim) kill() {
	_ = v.cmd.Process.Kill()
	<-v.exited
	_ = v.stdin.Close()
}
