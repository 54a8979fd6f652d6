package main

import (
	"encoding/json"
	"strings"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
)

// TestBenchClusterBadInput: bad flags, and a size that does not fit the
// machine, get one clear line before anything starts.
func TestBenchClusterBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"bench", "cluster", "--members", "2"}, want: "--members 2"},
		{args: []string{"bench", "cluster", "--instances", "-1"}, want: "--instances -1"},
		{args: []string{"bench", "cluster", "--instances", "100", "--services", "200"}, want: "--services 200"},
		{args: []string{"bench", "cluster", "--instances", "1000", "--services", "1", "--watchers", "101"}, want: "--watchers 101"},
		{args: []string{"bench", "cluster", "--kill", "everyone"}, want: `--kill "everyone"`},
		{args: []string{"bench", "cluster", "--net", "wifi"}, want: `--net "wifi"`},
		{args: []string{"bench", "cluster", "--dir", "/etc/passwd/x"}, want: `--dir "/etc/passwd/x"`},
		{args: []string{"bench", "cluster", "--instances", "10000000"}, want: "--instances 10000000 needs about"},
	})
}

// TestBenchClusterSmall runs `beacon bench cluster` at a size CI affords:
// three beacon serve members (this binary) in network namespaces when the
// test may make them, a follower SIGKILLed while registrations run — and
// every registration succeeds, every watcher has every instance, and no
// watcher sees a live instance removed.
func TestBenchClusterSmall(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 beacon serve nodes")
	}
	machine.Exclusive(t)
	b := startBeacon(t, t.TempDir(), nil, "bench", "cluster", "--instances", "600", "--services", "6", "--watchers", "18",
		"--rounds", "2", "--workers", "20", "--sessions", "2", "--kill-instances", "300", "-o", "json")
	if err := b.wait(t, 5*time.Minute); err != nil {
		t.Fatalf("bench cluster: %v\n%s\n%s", err, b.out(), b.errOut())
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Rows     []struct {
			Metric string  `json:"metric"`
			Beacon float64 `json:"beacon"`
		} `json:"rows"`
	}
	if err := json.Unmarshal([]byte(b.out()), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, b.out())
	}
	t.Logf("bench cluster:\n%s", b.out())
	got := map[string]float64{}
	for _, r := range rep.Rows {
		got[r.Metric] = r.Beacon
	}
	for metric, want := range map[string]float64{
		"registrations refused while a follower is SIGKILLed":  0,
		"instances a watcher never had (goal 0)":               0,
		"removals of live instances seen by watchers (goal 0)": 0,
		"instances resident in etcd at the end":                900,
	} {
		if v, ok := got[metric]; !ok || v != want {
			t.Errorf("%s = %v (reported: %v), want %v", metric, v, ok, want)
		}
	}
	if rate := got["registrations/s, 20 workers"]; rate <= 0 || strings.Contains(b.errOut(), "level=ERROR") {
		t.Errorf("registrations/s %v; stderr:\n%s", rate, b.errOut())
	}
}
