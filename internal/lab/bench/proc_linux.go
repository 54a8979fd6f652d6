package bench

import "syscall"

// childAttr makes a child process end (SIGTERM) when the benchmark's
// process does, even if it is killed without a chance to stop it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGTERM}
}
