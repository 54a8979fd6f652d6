package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"
)

// TestBenchCommandsBadInput: the bench commands refuse bad flags with one
// clear line and a non-zero exit, before starting anything.
func TestBenchCommandsBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{[]string{"bench", "register", "--instances", "-1"}, "--instances -1"},
		{[]string{"bench", "register", "-o", "yaml"}, "-o"},
		{[]string{"bench", "watch", "--watchers", "0"}, "--watchers 0"},
		{[]string{"bench", "watch", "--samples", "-5"}, "--samples -5"},
		{[]string{"bench", "failover", "--ttl", "100ms"}, "--ttl"},
		{[]string{"bench", "failover", "--children", "-2"}, "--children -2"},
		{[]string{"bench", "memory", "--mem-watchers", "-1"}, "--mem-watchers -1"},
		{[]string{"bench", "naming", "--backends", "1"}, "--backends 1"},
		{[]string{"bench", "naming", "--trials", "-1"}, "--trials -1"},
		{[]string{"bench", "naming", "--drain-grace", "-1s"}, "--drain-grace"},
		{[]string{"bench", "naming", "-o", "yaml"}, "-o"},
		{[]string{"bench", "register", "--concurrency", "0"}, "--concurrency 0"},
		{[]string{"bench", "register", "--concurrency", "64,-1"}, "--concurrency -1"},
		{[]string{"bench", "register", "--instances", "99999999999"}, "at most"},
		{[]string{"bench", "register", "--batch", "500"}, "--batch 500"},
		{[]string{"bench", "register", "--benchmark-bin", "/nonexistent/benchmark"}, "--benchmark-bin"},
		{[]string{"bench", "proxy", "--watches", "-1"}, "--watches -1"},
		{[]string{"bench", "proxy", "--clients", "-5"}, "--clients -5"},
		{[]string{"bench", "proxy", "--duration", "-1s"}, "--duration"},
		{[]string{"bench", "proxy", "--value-size", "2000000000"}, "--value-size"},
		{[]string{"bench", "proxy", "--watches", "5", "--streams", "10"}, "--streams 10"},
		{[]string{"bench", "proxy", "--etcd-bin", "/nonexistent/etcd"}, "--etcd-bin"},
		{[]string{"bench", "proxy", "-o", "yaml"}, "-o"},
		{[]string{"proxy", "--cache-max-staleness", "-1s"}, "--cache-max-staleness"},
		{[]string{"proxy", "--cache-max-bytes", "0"}, "--cache-max-bytes"},
	})
}

// TestBenchWatchSmall runs `beacon bench watch` with tiny sizes and reads
// its JSON report: Beacon's and raw etcd's latency side by side, and
// exactly one etcd watch for Beacon's watchers.
func TestBenchWatchSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts an embedded etcd")
	}
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
