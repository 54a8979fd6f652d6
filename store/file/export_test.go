package file

import (
	"os"
	"time"
)

// TearNextWrites makes every later log write stop halfway: it writes half
// the record, calls midway, and never returns (the test kills the process).
func TearNextWrites(midway func()) {
	writeAt = func(f *os.File, b []byte, off int64) (int, error) {
		if _, err := f.WriteAt(b[:len(b)/2], off); err != nil {
			return 0, err
		}
		midway()
		select {}
	}
}

// SetLockWarnAfter sets how long a lock wait lasts before it is logged,
// until the test ends.
func SetLockWarnAfter(t interface{ Cleanup(func()) }, d time.Duration) {
	old := lockWarnAfter
	lockWarnAfter = d
	t.Cleanup(func() { lockWarnAfter = old })
}
