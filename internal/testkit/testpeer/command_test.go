package testpeer

import (
	"bufio"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

// roleEnv tells this test binary, started again as a child, to play the
// test process that starts a peer (parentRole) or the peer (peerRole).
const (
	roleEnv    = "BEACON_TESTPEER_ROLE"
	parentRole = "parent"
	peerRole   = "peer"
)

func TestMain(m *testing.M) {
	switch os.Getenv(roleEnv) {
	case parentRole:
		// Start a peer that shares this process's stdout, say its PID,
		// and wait to be killed.
		peer := Command(os.Args[0], "-test.run=^$")
		peer.Env = append(os.Environ(), roleEnv+"="+peerRole)
		peer.Stdout = os.Stdout
		if err := peer.Start(); err != nil {
			fmt.Println("start:", err)
			os.Exit(2)
		}
		fmt.Println(peer.Process.Pid)
		untilKilled()
	case peerRole:
		untilKilled()
	}
	os.Exit(m.Run())
}

// untilKilled blocks until SIGKILL; the runtime, waiting for a signal,
// does not take it for a deadlock.
func untilKilled() {
	never := make(chan os.Signal, 1)
	signal.Notify(never, syscall.SIGUSR2)
	for range never {
	}
}

// TestCommandDiesWithTheTestProcess: a process started through Command
// ends when the process that started it is SIGKILLed, as a test binary is
// by a `go test` timeout or a CI job's end. The peer holds the write end
// of the pipe the test reads, so the pipe's end of file is its exit.
func TestCommandDiesWithTheTestProcess(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("only Linux has a parent-death signal")
	}
	parent := Command(os.Args[0], "-test.run=^$")
	parent.Env = append(os.Environ(), roleEnv+"="+parentRole)
	out, w, err := os.Pipe() // not StdoutPipe: Wait would close it
	if err != nil {
		t.Fatal(err)
	}
	defer out.Close()
	parent.Stdout = w
	err = parent.Start()
	w.Close()
	if err != nil {
		t.Fatal(err)
	}
	r := bufio.NewReader(out)
	line, err := r.ReadString('\n')
	pid, perr := strconv.Atoi(strings.TrimSpace(line))
	if err != nil || perr != nil {
		_ = parent.Process.Kill()
		_ = parent.Wait()
		t.Fatalf("the parent said %q (%v), not its peer's PID", line, err)
	}
	t.Cleanup(func() { _ = syscall.Kill(pid, syscall.SIGKILL) }) // if it outlived its parent

	if err := parent.Process.Kill(); err != nil {
		t.Fatal(err)
	}
	_ = parent.Wait() // returns once the parent is gone; the peer holds the pipe
	eof := make(chan error, 1)
	go func() { _, err := io.Copy(io.Discard, r); eof <- err }()
	select {
	case err := <-eof:
		if err != nil {
			t.Fatalf("reading the peer's stdout: %v", err)
		}
	case <-time.After(time.Minute):
		t.Fatalf("the peer (PID %d) outlived the process that started it by a minute", pid)
	}
}
