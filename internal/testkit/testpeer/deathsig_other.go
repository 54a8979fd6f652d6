//go:build !linux

package testpeer

import "syscall"

// dieWithParent: only Linux has a parent-death signal; elsewhere a test
// process that is killed may leave its children running.
func dieWithParent() *syscall.SysProcAttr { return &syscall.SysProcAttr{} }
