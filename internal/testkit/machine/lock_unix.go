//go:build unix

package machine

import (
	"os"
	"syscall"
)

// lock takes an exclusive lock on f, waiting for it; the kernel releases
// it when f is closed or the process dies.
func lock(f *os.File) error {
	for {
		err := syscall.Flock(int(f.Fd()), syscall.LOCK_EX)
		if err != syscall.EINTR {
			return err
		}
	}
}
