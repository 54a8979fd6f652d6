package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
)

// TestBenchCommandsBadInput: the bench commands refuse bad flags with one
// clear line and a non-zero exit, before starting anything.
func TestBenchCommandsBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"bench", "register", "--instances", "-1"}, want: "--instances -1"},
		{args: []string{"bench", "register", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "watch", "--watchers", "0"}, want: "--watchers 0"},
		{args: []string{"bench", "watch", "--samples", "-5"}, want: "--samples -5"},
		{args: []string{"bench", "failover", "--ttl", "100ms"}, want: "--ttl"},
		{args: []string{"bench", "failover", "--children", "-2"}, want: "--children -2"},
		{args: []string{"bench", "memory", "--mem-watchers", "-1"}, want: "--mem-watchers -1"},
		{args: []string{"bench", "naming", "--backends", "1"}, want: "--backends 1"},
		{args: []string{"bench", "naming", "--trials", "-1"}, want: "--trials -1"},
		{args: []string{"bench", "naming", "--drain-grace", "-1s"}, want: "--drain-grace"},
		{args: []string{"bench", "naming", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "register", "--concurrency", "0"}, want: "--concurrency 0"},
		{args: []string{"bench", "register", "--concurrency", "64,-1"}, want: "--concurrency -1"},
		{args: []string{"bench", "register", "--instances", "99999999999"}, want: "at most"},
		{args: []string{"bench", "register", "--batch", "500"}, want: "--batch 500"},
		{args: []string{"bench", "register", "--benchmark-bin", "/nonexistent/benchmark"}, want: "--benchmark-bin"},
		{args: []string{"bench", "proxy", "--watches", "-1"}, want: "--watches -1"},
		{args: []string{"bench", "proxy", "--clients", "-5"}, want: "--clients -5"},
		{args: []string{"bench", "proxy", "--duration", "-1s"}, want: "--duration"},
		{args: []string{"bench", "proxy", "--value-size", "2000000000"}, want: "--value-size"},
		{args: []string{"bench", "proxy", "--watches", "5", "--streams", "10"}, want: "--streams 10"},
		{args: []string{"bench", "proxy", "--etcd-bin", "/nonexistent/etcd"}, want: "--etcd-bin"},
		{args: []string{"bench", "proxy", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "bootstrap", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "dns", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "register", "--cpuprofile", "/nonexistent/dir/cpu.prof", "--no-ceiling", "--instances", "1", "--sequential", "1"}, want: "/nonexistent/dir/cpu.prof", exit: exitFailure},
		{args: []string{"proxy", "--cache-max-staleness", "-1s"}, want: "--cache-max-staleness"},
		{args: []string{"proxy", "--cache-max-bytes", "0"}, want: "--cache-max-bytes"},
		{args: []string{"proxy", "--max-streams-per-client", "0"}, want: "--max-streams-per-client 0: 0 is not a value of this flag"},
	})
}

// TestBenchWatchSmall runs `beacon bench watch` with tiny sizes and reads
// its JSON report: Beacon's and raw etcd's latency side by side, and
// exactly one etcd watch for Beacon's watchers.
func TestBenchWatchSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
	machine.Exclusive(t)
	b := startBeacon(t, t.TempDir(), nil, "bench", "watch", "--watchers", "1,5", "--samples", "3", "--no-fsync", "-o", "json")
	if err := b.wait(t, 2*time.Minute); err != nil {
		t.Fatalf("bench watch: %v\n%s", err, b.errOut())
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Rows     []struct {
			Metric   string  `json:"metric"`
			Beacon   float64 `json:"beacon"`
			Baseline float64 `json:"baseline"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(b.out()), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, b.out())
	}
	watches := 0
	for _, r := range rep.Rows {
		if strings.HasPrefix(r.Metric, "etcd server watches") {
			watches++
			if r.Beacon != 1 {
				t.Errorf("%s: Beacon %v, want 1", r.Metric, r.Beacon)
			}
		} else if r.Beacon <= 0 || r.Baseline <= 0 {
			t.Errorf("%s: Beacon %v, raw %v", r.Metric, r.Beacon, r.Baseline)
		}
	}
	if rep.Scenario != "watch" || watches != 2 {
		t.Fatalf("report %+v", rep)
	}
}
