package bench

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"strconv"
	"strings"
)

// A run's memory, planned before it starts: a size that does not fit this
// machine is refused up front, with what it would need, rather than found
// out by the kernel's OOM killer an hour in (leaving processes and leases
// behind).
//
// The costs are resident memory per unit, every process of the run
// included, measured with `beacon bench memory --mem-instances 100000
// --mem-watchers 100000` (2026-12-02, 2 cores, etcd 3.7 embedded; RSS
// sampled from /proc while it ran) and rounded up:
//
//   - an instance resident in etcd: 1,470 B with a lease each (raw), 705 B
//     under one session lease (Beacon); the plan takes the larger side;
//   - a registration held by the registering process: about 1 kB of heap
//     (issue 26's profile), twice that resident under GOGC=100;
//   - a watcher, one Beacon and one raw per step: 539 MB resident for
//     100,000 of each in the bench process (5.4 kB per pair), plus about
//     600 B per raw watch in etcd;
//   - a watcher that follows its watch in a goroutine of its own, one of
//     each side (the watch scenario: `beacon bench watch --watchers 100000
//     --samples 20`): 2.85 GB resident for 100,000 pairs (28.5 kB each),
//     plus, per sample, 34 B per pair (each side's delay, received mark
//     and its copy in the results); since each side's watchers run in a
//     process of their own, the same per pair, split between the two,
//     plus a Go process's baseline for each (costWatchProcess).
//
// Only what is resident at once is counted (etcd's history of keys
// already deleted is not); the fraction of MemAvailable a plan may take
// leaves room for that and for the processes' baselines.
const (
	costEtcdInstance  = 1536
	costRegistration  = 2048
	costWatcherPair   = 7 << 10
	costFollowerPair  = 30 << 10
	costSamplePair    = 34
	costWatchProcess  = 64 << 20
	memPlanHeadroom   = 0.8 // of MemAvailable
	memPlanBaseline   = 256 << 20
	memInfoPath       = "/proc/meminfo"
	memAvailableField = "MemAvailable:"
)

// memNeed is one flag's share of a plan: n units of per bytes each.
type memNeed struct {
	flag string // e.g. "--instances"; "" for a fixed share (the watch scenario's two processes)
	n    int
	per  int64
	what string // "instances registered at once", for the message
}

// memAvailable returns the memory the kernel can give without swapping
// (MemAvailable in /proc/meminfo); a variable so that tests set the
// machine.
var memAvailable = func() (int64, error) {
	f, err := os.Open(memInfoPath)
	if err != nil {
		return 0, err
	}
	defer f.Close()
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		if v, ok := strings.CutPrefix(sc.Text(), memAvailableField); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(v), "kB")), 10, 64)
			if err != nil {
				return 0, fmt.Errorf("%s: %s %q: %w", memInfoPath, memAvailableField, v, err)
			}
			return kb << 10, nil
		}
	}
	if err := sc.Err(); err != nil {
		return 0, err
	}
	return 0, fmt.Errorf("%s has no %s line", memInfoPath, strings.TrimSuffix(memAvailableField, ":"))
}

// ErrTooBig is the error of a run whose sizes do not fit this machine's
// memory: bad input (the message says the largest size that fits).
var ErrTooBig = errors.New("bench: the run does not fit this machine's memory")

// fits refuses the plan of needs if it would take more than
// memPlanHeadroom of the memory available, naming the largest need, what
// the plan would take and the largest size of that flag that fits. A
// machine whose available memory cannot be read is not refused.
func fits(needs ...memNeed) error {
	avail, err := memAvailable()
	if err != nil {
		return nil // not Linux, or no /proc: the run finds out
	}
	budget := int64(float64(avail) * memPlanHeadroom)
	total := int64(memPlanBaseline)
	var top memNeed
	for _, n := range needs {
		total += int64(n.n) * n.per
		if n.flag != "" && int64(n.n)*n.per > int64(top.n)*top.per { // a need of no flag is fixed: none to advise
			top = n
		}
	}
	if total <= budget || top.n == 0 {
		return nil
	}
	rest := total - int64(top.n)*top.per
	most := max((budget-rest)/top.per, 0)
	return fmt.Errorf("%w: %s %d needs about %s (%d %s × %s), the whole run about %s; this machine has %s available, "+
		"of which a run may take %.0f%%: use %s %d or less", ErrTooBig, top.flag, top.n, bytesIEC(int64(top.n)*top.per), top.n,
		top.what, bytesIEC(top.per), bytesIEC(total), bytesIEC(avail), memPlanHeadroom*100, top.flag, most)
}

// bytesIEC renders b in B, KiB, MiB or GiB, with one decimal above KiB.
func bytesIEC(b int64) string {
	switch {
	case b >= 1<<30:
		return fmt.Sprintf("%.1f GiB", float64(b)/(1<<30))
	case b >= 1<<20:
		return fmt.Sprintf("%.1f MiB", float64(b)/(1<<20))
	case b >= 1<<10:
		return fmt.Sprintf("%.1f KiB", float64(b)/(1<<10))
	}
	return fmt.Sprintf("%d B", b)
}
