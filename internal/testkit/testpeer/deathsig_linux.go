package testpeer

import "syscall"

// dieWithParent asks the kernel to SIGKILL the child when its parent
// ends (PR_SET_PDEATHSIG). Strictly, when the OS thread that started it
// ends; the Go runtime ends a thread only when a goroutine locked to it
// (runtime.LockOSThread) returns without unlocking, which no test does
// while starting a process. Go sets it after a Credential's setuid, which
// would otherwise clear it.
func dieWithParent() *syscall.SysProcAttr {
	return &syscall.SysProcAttr{Pdeathsig: syscall.SIGKILL}
}
