package bench

import "syscall"

// childAttr starts a child process in a process group of its own, so that
// a terminal's Ctrl-C (SIGINT to the foreground group) reaches only the
// benchmark, which then undoes its run in order (revokes its leases while
// the etcd it started still answers) and stops its children itself; and
// makes the child end (SIGTERM) when the benchmark's process does, even
// if it is killed without a chance to stop it.
func childAttr() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Setpgid: true, Pdeathsig: syscall.SIGTERM}
}
