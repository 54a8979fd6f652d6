package bench

import (
	"context"
	"errors"
	"slices"
	"strings"
	"sync"
	"testing"
	"time"
)

// TestArrivalsCompleteOncePerSample: a sample is complete once every
// watcher has it, whatever else arrives (a repeat, a sample out of range).
func TestArrivalsCompleteOncePerSample(t *testing.T) {
	var complete []int
	a := newArrivals(2, 3, func(s int) { complete = append(complete, s) })
	a.got(0, 0)
	a.got(0, 0) // a repeat counts once
	a.got(0, 1)
	a.got(-1, 2)
	a.got(2, 2) // no such samples
	if len(complete) != 0 {
		t.Fatalf("complete %v after 2 of 3 watchers had sample 0", complete)
	}
	a.got(0, 2)
	a.got(1, 0)
	if !slices.Equal(complete, []int{0}) {
		t.Fatalf("complete %v, want [0]", complete)
	}
}

// TestArrivalsReachTheBenchmark: what a watcher process writes when it
// ends is what the benchmark reads, a watcher that missed a sample
// included, and the delays are arrival minus write time.
func TestArrivalsReachTheBenchmark(t *testing.T) {
	a := newArrivals(2, 3, func(int) {})
	a.got(0, 0)
	a.got(0, 2)
	a.got(1, 1)
	var out strings.Builder
	if err := a.write(&out); err != nil {
		t.Fatal(err)
	}
	c := &watchChild{side: sideRaw, got: make([]chan struct{}, 2), at: make([][]int64, 2), ready: make(chan struct{})}
	var once sync.Once
	for _, l := range strings.Split(strings.TrimSpace(out.String()), "\n") {
		if err := c.line(l, &once); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
	}
	for s := range a.at {
		if !slices.Equal(c.at[s], a.at[s]) {
			t.Fatalf("sample %d read as %v, written %v", s, c.at[s], a.at[s])
		}
	}
	if c.at[0][1] != 0 || c.at[1][0] != 0 {
		t.Fatalf("missed samples read as arrivals: %v", c.at)
	}
	t0 := []int64{a.at[0][0] - int64(time.Millisecond), a.at[1][1] - int64(2*time.Millisecond)}
	got := delays(c.at, t0)
	want := []time.Duration{time.Millisecond, time.Duration(a.at[0][2] - t0[0]), 2 * time.Millisecond}
	if !slices.Equal(got, want) {
		t.Fatalf("delays %v, want %v", got, want)
	}
}

// TestWatchChildLines: the benchmark refuses what a watcher process must
// not say, and takes "ready", "got" (also twice) and "stats".
func TestWatchChildLines(t *testing.T) {
	c := &watchChild{side: sideBeacon, got: []chan struct{}{make(chan struct{})}, at: make([][]int64, 1), ready: make(chan struct{})}
	var once sync.Once
	for _, l := range []string{"ready", "ready", "got 0", "got 0", "stats gc=1"} {
		if err := c.line(l, &once); err != nil {
			t.Fatalf("line %q: %v", l, err)
		}
	}
	select {
	case <-c.got[0]:
	default:
		t.Fatal("got 0 did not complete sample 0")
	}
	if c.stats != "gc=1" {
		t.Fatalf("stats %q", c.stats)
	}
	for _, l := range []string{"got 1", "got x", "at 1 5 0", "at 0 x", "at 0 5 y", "hello"} {
		if err := c.line(l, &once); err == nil {
			t.Errorf("line %q taken", l)
		}
	}
}

func TestWatchChildConfigValidate(t *testing.T) {
	ok := WatchChildConfig{Side: sideRaw, Endpoints: []string{"http://127.0.0.1:2379"}, Namespace: "w", Watchers: 1, Samples: 1}
	if err := ok.Validate(); err != nil {
		t.Fatal(err)
	}
	for _, mutate := range []func(*WatchChildConfig){
		func(c *WatchChildConfig) { c.Side = "other" }, func(c *WatchChildConfig) { c.Endpoints = nil },
		func(c *WatchChildConfig) { c.Namespace = "" }, func(c *WatchChildConfig) { c.Watchers = 0 },
		func(c *WatchChildConfig) { c.Samples = 0 },
	} {
		c := ok
		mutate(&c)
		if err := c.Validate(); err == nil {
			t.Errorf("%+v: no error", c)
		}
	}
}

// TestWatchPlanCountsItsWatcherProcesses: the watch scenario's plan counts
// the baseline of its two watcher processes: one watcher does not fit a
// machine that has room for the benchmark's baseline alone.
func TestWatchPlanCountsItsWatcherProcesses(t *testing.T) {
	onMachine(t, int64(float64(memPlanBaseline+costWatchProcess)/memPlanHeadroom), nil)
	_, err := RunWatch(context.Background(), RegistryConfig{Watchers: []int{1}, Samples: 1})
	if !errors.Is(err, ErrTooBig) {
		t.Fatalf("one watcher with room for one watcher process: %v, want ErrTooBig", err)
	}
	if !strings.Contains(err.Error(), "use --watchers 0 or less") {
		t.Fatalf("the refusal advises no flag the user can change: %v", err)
	}
}
