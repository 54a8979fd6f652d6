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
