package machine

import (
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
)

// A second holder waits for the first: it gets the lock only once the
// first test has ended (its cleanups ran).
func TestExclusiveWaitsForTheHolder(t *testing.T) {
	var ended atomic.Bool
	held, done := make(chan struct{}), make(chan struct{})
	outer := t // the goroutine outlives the subtest
	t.Run("first", func(t *testing.T) {
		Exclusive(t)
		t.Cleanup(func() { ended.Store(true) }) // runs before Exclusive's own
		go func() {
			defer close(done)
			f, err := os.OpenFile(filepath.Join(os.TempDir(), lockName), os.O_RDWR, 0)
			if err != nil {
				outer.Error(err)
				return
			}
			defer f.Close()
			close(held)
			if err := lock(f); err != nil {
				outer.Error(err)
			}
			if !ended.Load() {
				outer.Error("the second holder got the lock while the first test ran")
			}
		}()
		<-held
	})
	<-done
}
