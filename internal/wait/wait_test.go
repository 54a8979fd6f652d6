package wait

import (
	"context"
	"testing"
	"time"
)

func TestSleep(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	if !Sleep(ctx, time.Millisecond) {
		t.Error("Sleep with a live context did not report the time elapsed")
	}
	if !Sleep(ctx, 0) || !Sleep(ctx, -time.Second) {
		t.Error("a zero or negative Sleep with a live context reported it done")
	}
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Error("Sleep with a done context reported an hour elapsed")
	}
	if Sleep(ctx, 0) {
		t.Error("a zero Sleep with a done context reported the time elapsed")
	}
}

// Every runs its task until the context ends, and returns then.
func TestEvery(t *testing.T) {
	ctx, cancel := context.WithCancel(context.Background())
	calls := 0
	done := make(chan struct{})
	go func() {
		defer close(done)
		Every(ctx, time.Millisecond, func() {
			if calls++; calls == 3 {
				cancel()
			}
		})
	}()
	select {
	case <-done:
	case <-time.After(time.Minute):
		t.Fatal("Every did not return after its context ended")
	}
	if calls != 3 {
		t.Errorf("%d calls, want 3 (the task ran after the context ended)", calls)
	}
}
