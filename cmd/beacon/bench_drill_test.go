package main

import (
	"encoding/json"
	"os"
	"os/exec"
	"testing"
	"time"

	"github.com/beaconplane/beacon/internal/testkit/machine"
	"github.com/beaconplane/beacon/internal/testkit/testpeer"
)

// testSelfCommand runs this test binary as `beacon args...` (see TestMain).
func testSelfCommand(args ...string) *exec.Cmd {
	exe, err := os.Executable()
	if err != nil {
		exe = os.Args[0]
	}
	cmd := testpeer.Command(exe)
	encoded, err := json.Marshal(args)
	if err != nil {
		panic(err) // a []string always encodes
	}
	cmd.Env = append(os.Environ(), beaconMainEnv+"="+string(encoded))
	return cmd
}

// TestBenchDrillBadInput: bad flags get one clear line before anything
// starts.
func TestBenchDrillBadInput(t *testing.T) {
	checkBadInput(t, []badInput{
		{args: []string{"bench", "drill", "--trials", "0"}, want: "--trials 0"},
		{args: []string{"bench", "drill", "--sessions", "-1"}, want: "--sessions -1"},
		{args: []string{"bench", "drill", "--ttl", "1s"}, want: "--ttl 1s"},
		{args: []string{"bench", "drill", "--net", "wifi"}, want: "--net"},
		{args: []string{"bench", "drill", "--drills", "meteor"}, want: "meteor"},
		{args: []string{"bench", "drill", "--dir", "/etc/passwd/x"}, want: `--dir "/etc/passwd/x"`},
		{args: []string{"bench", "drill", "-o", "yaml"}, want: "-o"},
		{args: []string{"bench", "drill", "--etcd-bin", "/no/such/etcd"}, want: "--etcd-bin"},
		{args: []string{"bench", "drill", "--expiry", "-5"}, want: "--expiry -5"},
		{args: []string{"bench", "drill", "--expiry", "10", "--expiry-processes", "20"}, want: "--expiry-processes 20"},
		{args: []string{"bench", "drill", "--lease-ttls", "1500ms"}, want: "--lease-ttls 1.5s"},
		{args: []string{"bench", "drill", "--fsync-delay", "-1s"}, want: "--fsync-delay -1s"},
	})
}

// TestBenchDrillServeNodes runs `beacon bench drill` as users would: its
// members are beacon serve nodes (this binary) that formed a 3-member
// cluster through a discovery token, and the drills that matter most —
// one member hung while two are healthy, and the leader killed — meet
// their goals there too.
func TestBenchDrillServeNodes(t *testing.T) {
	if testing.Short() {
		t.Skip("starts 4 beacon serve nodes")
	}
	machine.Exclusive(t)
	b := startBeacon(t, t.TempDir(), nil, "bench", "drill", "--drills", "member-hang,leader-kill", "--trials", "1",
		"--sessions", "8", "--watchers", "2", "-o", "json")
	if err := b.wait(t, 5*time.Minute); err != nil {
		t.Fatalf("bench drill: %v\n%s\n%s", err, b.out(), b.errOut())
	}
	var rep struct {
		Scenario string `json:"scenario"`
		Drills   []struct {
			Drill   string `json:"drill"`
			Trials  int    `json:"trials"`
			Lost    int    `json:"lost"`
			Phantom int    `json:"phantom"`
			Flaps   int    `json:"flaps"`
			Met     bool   `json:"met"`
		} `json:"drills"`
	}
	if err := json.Unmarshal([]byte(b.out()), &rep); err != nil {
		t.Fatalf("report: %v\n%s", err, b.out())
	}
	t.Logf("bench drill on beacon serve nodes:\n%s\n%s", b.errOut(), b.out())
	if rep.Scenario != "drill" || len(rep.Drills) != 2 {
		t.Fatalf("report %+v", rep)
	}
	for _, d := range rep.Drills {
		if d.Trials < 1 || !d.Met {
			t.Errorf("%s: %+v", d.Drill, d)
		}
	}
}
