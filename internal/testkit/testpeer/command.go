package testpeer

import (
	"context"
	"os/exec"
)

// Command is exec.Command for every process a test starts (a peer, a
// beacon binary, the test binary in another role, a short-lived tool):
// the process dies (SIGKILL) with the test process however that ends — a
// `go test -timeout` panic, a CI job killed, a crash — so no etcd,
// nats-server or CoreDNS outlives its test and holds its ports, its
// directory or a CPU for the next run. The test still stops what it
// started (cleanup, signals, Wait) as before; this covers only the test
// process's own end.
//
// Its SysProcAttr is set: add to its fields (cmd.SysProcAttr.Setpgid =
// true), never replace it. cmd/beacon's TestTestsStartProcessesThroughTestpeer
// holds every test and test helper to this function.
func Command(name string, arg ...string) *exec.Cmd {
	cmd := exec.Command(name, arg...)
	cmd.SysProcAttr = dieWithParent()
	return cmd
}

// CommandContext is Command with exec.CommandContext's context: the
// process is also killed when ctx is done.
func CommandContext(ctx context.Context, name string, arg ...string) *exec.Cmd {
	cmd := exec.CommandContext(ctx, name, arg...)
	cmd.SysProcAttr = dieWithParent()
	return cmd
}
