package bench

import (
	"bytes"
	"strings"
	"testing"
	"time"
)

func TestReportTable(t *testing.T) {
	r := Report{Scenario: "register", Setup: "1 node"}
	r.Add(Row{Metric: "registrations/s", Unit: "1/s", Beacon: 3000, Baseline: 1000, HigherIsBetter: true, Goal: 3})
	r.Add(Row{Metric: "p99", Unit: "ms", Beacon: 2, Baseline: 1, Goal: 1})
	r.Add(Row{Metric: "false removals", Unit: "n", Beacon: 0, Baseline: 0, Goal: 1})
	var buf bytes.Buffer
	if err := r.WriteTable(&buf); err != nil {
		t.Fatal(err)
	}
	out := buf.String()
	for _, want := range []string{"3.00x", ">= 3.00x met", "<= 1.00x MISSED", "<= 1.00x no baseline", "raw etcd"} {
		if !strings.Contains(out, want) {
			t.Errorf("table lacks %q:\n%s", want, out)
		}
	}
	if strings.Contains(out, "NaN") {
		t.Errorf("a zero baseline printed NaN:\n%s", out)
	}
	if err := r.WriteJSON(&buf); err != nil {
		t.Fatal(err)
	}
}

func TestPercentile(t *testing.T) {
	var s []time.Duration
	for i := 1; i <= 100; i++ {
		s = append(s, time.Duration(i)*time.Millisecond)
	}
	if got := Percentile(s, 50); got != 50*time.Millisecond {
		t.Errorf("p50 = %v", got)
	}
	if got := Percentile(s, 99); got != 99*time.Millisecond {
		t.Errorf("p99 = %v", got)
	}
	if got := Percentile(nil, 99); got != 0 {
		t.Errorf("empty = %v", got)
	}
}

// rowsByMetric logs r's table and returns its rows by metric, after
// checking that every metric in want is there.
func rowsByMetric(t *testing.T, r *Report, want ...string) map[string]Row {
	t.Helper()
	var b strings.Builder
	if err := r.WriteTable(&b); err != nil {
		t.Fatal(err)
	}
	t.Log("\n" + b.String())
	seen := map[string]Row{}
	for _, row := range r.Rows {
		seen[row.Metric] = row
	}
	for _, m := range want {
		if _, ok := seen[m]; !ok {
			t.Errorf("report lacks %q:\n%s", m, b.String())
		}
	}
	return seen
}
