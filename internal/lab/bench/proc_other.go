//go:build !linux

package bench

import "syscall"

// childAttr: no parent-death signal outside Linux; children are stopped
// by the scenario.
func childAttr() *syscall.SysProcAttr { return nil }
