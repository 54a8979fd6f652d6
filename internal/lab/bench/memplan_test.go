package bench

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"testing"
	"time"
)

// onMachine sets the memory available for the test's duration.
func onMachine(t *testing.T, avail int64, err error) {
	t.Helper()
	old := memAvailable
	memAvailable = func() (int64, error) { return avail, err }
	t.Cleanup(func() { memAvailable = old })
}

// TestFits: a plan within the headroom passes; one beyond it is refused
// naming its largest flag, what it needs, what the machine has and the
// largest size that fits (which then passes); a machine whose memory
// cannot be read refuses nothing.
func TestFits(t *testing.T) {
	onMachine(t, 8<<30, nil) // budget 6.4 GiB, 256 MiB of it the baseline
	small := memNeed{"--instances", 100_000, costEtcdInstance + costRegistration, "instances registered at once"}
	if err := fits(small); err != nil {
		t.Fatalf("100,000 instances on 8 GiB: %v", err)
	}
	big := memNeed{"--instances", 10_000_000, costEtcdInstance + costRegistration, "instances registered at once"}
	err := fits(big, memNeed{"--watchers", 1000, costWatcherPair, "watchers"})
	if !errors.Is(err, ErrTooBig) {
		t.Fatalf("10M instances on 8 GiB: %v, want ErrTooBig", err)
	}
	most := (int64(8<<30)*8/10 - memPlanBaseline - 1000*costWatcherPair) / (costEtcdInstance + costRegistration)
	for _, want := range []string{"--instances 10000000 needs about 33.4 GiB (10000000 instances registered at once × 3.5 KiB)",
		"this machine has 8.0 GiB available", "a run may take 80%", fmt.Sprintf("use --instances %d or less", most)} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("error %q lacks %q", err, want)
		}
	}
	big.n = int(most)
	if err := fits(big, memNeed{"--watchers", 1000, costWatcherPair, "watchers"}); err != nil {
		t.Fatalf("the size the error offers: %v", err)
	}
	big.n++
	if err := fits(big, memNeed{"--watchers", 1000, costWatcherPair, "watchers"}); err == nil {
		t.Fatal("one more than the size the error offers fits")
	}
	onMachine(t, 0, errors.New("no /proc"))
	if err := fits(memNeed{"--instances", 10_000_000, costEtcdInstance, "instances"}); err != nil {
		t.Fatalf("unknown memory: %v, want no refusal", err)
	}
}

// TestRunRefusesWhatDoesNotFit: the scenarios refuse a size that does not
// fit before they start anything (no etcd, no process: the call returns
// at once with ErrTooBig).
func TestRunRefusesWhatDoesNotFit(t *testing.T) {
	onMachine(t, 1<<30, nil)
	for name, run := range map[string]func() (*Report, error){
		"register": func() (*Report, error) {
			return RunRegister(context.Background(), RegistryConfig{Instances: 10_000_000})
		},
		"watch": func() (*Report, error) {
			return RunWatch(context.Background(), RegistryConfig{Watchers: []int{1, 1_000_000}})
		},
		"memory": func() (*Report, error) {
			return RunMemory(context.Background(), RegistryConfig{MemWatchers: 1_000_000})
		},
	} {
		if _, err := run(); !errors.Is(err, ErrTooBig) {
			t.Errorf("%s: %v, want ErrTooBig", name, err)
		}
	}
}

// TestMemAvailable reads this machine's /proc/meminfo (where there is one).
func TestMemAvailable(t *testing.T) {
	n, err := memAvailable()
	if err != nil {
		t.Skipf("no %s here: %v", memInfoPath, err)
	}
	if n <= 0 {
		t.Fatalf("MemAvailable %d", n)
	}
}

// TestCleanupContext: the cleanup of a run outlives its context's end by
// the grace, and no more: an interrupted run still removes what it made,
// and a store that no longer answers does not hold the interrupt up.
func TestCleanupContext(t *testing.T) {
	run, interrupt := context.WithCancel(context.Background())
	long, releaseLong := cleanupContext(run, time.Hour)
	short, releaseShort := cleanupContext(run, time.Millisecond)
	defer releaseShort()
	interrupt()
	select {
	case <-short.Done():
	case <-time.After(10 * time.Second):
		t.Fatal("cleanup with 1 ms of grace not ended 10 s after its run was")
	}
	if err := long.Err(); err != nil {
		t.Fatalf("cleanup with an hour of grace ended with its run: %v", err)
	}
	releaseLong()
	if long.Err() == nil {
		t.Fatal("release did not end the cleanup")
	}
}
