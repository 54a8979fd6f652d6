package file

import "os"

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
