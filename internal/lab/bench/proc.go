package bench

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	clientv3 "go.etcd.io/etcd/client/v3"
	"go.uber.org/zap"

	"github.com/beaconplane/beacon/internal/syncbuf"
)

// proc is a program a scenario measures in a process of its own: Beacon's
// proxy, or etcd's grpc-proxy. Its CPU time and resident memory are read
// from /proc (Linux; elsewhere they read as zero and print as "-").
type proc struct {
	name   string
	addr   string // host:port it serves etcd's API on
	cmd    *exec.Cmd
	out    *syncbuf.Buffer
	done   chan struct{}
	tmpDir string
}

// startProc starts argv (which must serve etcd's gRPC API on addr) and
// waits until an etcd client can read through it.
func startProc(ctx context.Context, log *slog.Logger, name, addr string, argv []string, tmpDir string) (*proc, error) {
	cli, err := clientv3.New(clientv3.Config{Endpoints: []string{addr}, DialTimeout: time.Second, Logger: zap.NewNop()})
	if err != nil {
		return nil, err
	}
	defer cli.Close()
	return startProcReady(ctx, log, name, addr, argv, tmpDir, func(ctx context.Context) error {
		_, err := cli.Get(ctx, "bench/ready")
		return err
	})
}

// startProcReady starts argv and waits (at most 30 s) until ready, tried
// with a second each, succeeds.
func startProcReady(ctx context.Context, log *slog.Logger, name, addr string, argv []string, tmpDir string, ready func(context.Context) error) (*proc, error) {
	cmd := exec.Command(argv[0], argv[1:]...)
	cmd.SysProcAttr = childAttr() // ends with the benchmark, even if it is killed
	p := &proc{name: name, addr: addr, cmd: cmd, out: &syncbuf.Buffer{}, done: make(chan struct{}), tmpDir: tmpDir}
	cmd.Stdout, cmd.Stderr = p.out, p.out
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("bench: start %s (%s): %w", name, argv[0], err)
	}
	go func() { _ = cmd.Wait(); close(p.done) }()
	log.Info("started", "process", name, "pid", cmd.Process.Pid, "addr", addr)
	deadline := time.Now().Add(30 * time.Second)
	for {
		cctx, cancel := context.WithTimeout(ctx, time.Second)
		err := ready(cctx)
		cancel()
		if err == nil {
			return p, nil
		}
		select {
		case <-p.done:
			return nil, fmt.Errorf("bench: %s exited: %s", name, lastLines(p.out.String(), 5))
		case <-ctx.Done():
			p.stop()
			return nil, ctx.Err()
		default:
		}
		if time.Now().After(deadline) {
			p.stop()
			return nil, fmt.Errorf("bench: %s not serving on %s after 30 s: %v; output: %s", name, addr, err, lastLines(p.out.String(), 5))
		}
		time.Sleep(50 * time.Millisecond) // a process offers no event to wait on
	}
}

// stop ends the process (SIGTERM, then SIGKILL after 10 s) and removes
// its temporary directory.
func (p *proc) stop() {
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
	case <-time.After(10 * time.Second):
		_ = p.cmd.Process.Kill()
		<-p.done
	}
	if p.tmpDir != "" {
		_ = os.RemoveAll(p.tmpDir)
	}
}

// userHZ is the unit of /proc/<pid>/stat's CPU times (USER_HZ, 100 on
// every Linux platform Go supports).
const userHZ = 100

// cpu is the CPU time (user + system) the process has used: the sum of
// its threads' run times in /proc/<pid>/task/*/schedstat (nanoseconds),
// or /proc/<pid>/stat's (10 ms ticks) where schedstat is missing.
func (p *proc) cpu() time.Duration { return processCPU(p.cmd.Process.Pid) }

// processCPU is the CPU time process pid has used (see proc.cpu).
func processCPU(pid int) time.Duration {
	if tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid)); err == nil {
		var sum time.Duration
		ok := false
		for _, t := range tasks {
			b, err := os.ReadFile(fmt.Sprintf("/proc/%d/task/%s/schedstat", pid, t.Name()))
			if err != nil {
				continue
			}
			f := strings.Fields(string(b))
			if len(f) == 0 {
				continue
			}
			if ns, err := strconv.ParseInt(f[0], 10, 64); err == nil {
				sum += time.Duration(ns)
				ok = true
			}
		}
		if ok {
			return sum
		}
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The command name (field 2) may hold spaces: fields count from the
	// closing parenthesis.
	s := string(b)
	i := strings.LastIndexByte(s, ')')
	if i < 0 {
		return 0
	}
	f := strings.Fields(s[i+1:])
	if len(f) < 13 {
		return 0
	}
	ut, err1 := strconv.ParseInt(f[11], 10, 64)
	st, err2 := strconv.ParseInt(f[12], 10, 64)
	if errors.Join(err1, err2) != nil {
		return 0
	}
	return time.Duration(ut+st) * time.Second / userHZ
}

// rss is the process's resident memory in bytes.
func (p *proc) rss() float64 { return processRSS(p.cmd.Process.Pid) }

// processRSS is process pid's resident memory in bytes (VmRSS in
// /proc/<pid>/status; 0 when not known).
func processRSS(pid int) float64 {
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		return 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		if v, ok := strings.CutPrefix(line, "VmRSS:"); ok {
			f := strings.Fields(v)
			if len(f) == 2 && f[1] == "kB" {
				n, err := strconv.ParseFloat(f[0], 64)
				if err == nil {
					return n * 1024
				}
			}
		}
	}
	return 0
}
