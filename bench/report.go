package bench

import (
	"encoding/json"
	"fmt"
	"io"
	"math"
	"slices"
	"text/tabwriter"
	"time"
)

// Row is one measured quantity: Beacon's figure, the raw etcd baseline's,
// and how to read their ratio.
type Row struct {
	Metric   string  `json:"metric"`
	Unit     string  `json:"unit"`
	Beacon   float64 `json:"beacon"`
	Baseline float64 `json:"baseline"`
	// HigherIsBetter is true for throughputs, false for latencies and
	// memory. It only affects the verdict column.
	HigherIsBetter bool `json:"higher_is_better"`
	// Goal is the target ratio Beacon/baseline (0: none).
	Goal float64 `json:"goal,omitempty"`
}

// Ratio is Beacon / baseline (NaN when the baseline is zero).
func (r Row) Ratio() float64 {
	if r.Baseline == 0 {
		return math.NaN()
	}
	return r.Beacon / r.Baseline
}

// Met reports whether the goal is met (true when there is no goal).
func (r Row) Met() bool {
	if r.Goal == 0 {
		return true
	}
	if math.IsNaN(r.Ratio()) {
		return false // no baseline to compare with
	}
	if r.HigherIsBetter {
		return r.Ratio() >= r.Goal
	}
	return r.Ratio() <= r.Goal
}

// Report is the result of one scenario.
type Report struct {
	Scenario string `json:"scenario"`
	Setup    string `json:"setup"`
	// BaselineName heads the baseline column; "raw etcd" when empty.
	BaselineName string   `json:"baseline_name,omitempty"`
	Rows         []Row    `json:"rows"`
	Notes        []string `json:"notes,omitempty"`
}

// Add appends a row.
func (r *Report) Add(row Row) { r.Rows = append(r.Rows, row) }

// Note appends a free-form line printed under the table.
func (r *Report) Note(format string, args ...any) {
	r.Notes = append(r.Notes, fmt.Sprintf(format, args...))
}

// WriteTable prints the report as an aligned table.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "== %s ==\n", r.Scenario)
	if r.Setup != "" {
		fmt.Fprintf(w, "%s\n", r.Setup)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	baseline := r.BaselineName
	if baseline == "" {
		baseline = "raw etcd"
	}
	fmt.Fprintf(tw, "metric\tunit\tbeacon\t%s\tratio\tgoal\t\n", baseline)
	for _, row := range r.Rows {
		goal := "-"
		if row.Goal != 0 {
			cmp := "<="
			if row.HigherIsBetter {
				cmp = ">="
			}
			verdict := "met"
			if !row.Met() {
				verdict = "MISSED"
			}
			goal = fmt.Sprintf("%s %.2fx %s", cmp, row.Goal, verdict)
		}
		ratio := "-"
		if r := row.Ratio(); !math.IsNaN(r) {
			ratio = fmt.Sprintf("%.2fx", r)
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Metric, row.Unit,
			FormatValue(row.Beacon), FormatValue(row.Baseline), ratio, goal)
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, n := range r.Notes {
		fmt.Fprintf(w, "  %s\n", n)
	}
	_, err := fmt.Fprintln(w)
	return err
}

// WriteJSON prints the report as one JSON object.
func (r *Report) WriteJSON(w io.Writer) error {
	return json.NewEncoder(w).Encode(r)
}

// FormatValue prints a figure with sensible precision.
func FormatValue(v float64) string {
	switch {
	case math.IsNaN(v):
		return "-"
	case v == math.Trunc(v) && math.Abs(v) < 1e9:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 100:
		return fmt.Sprintf("%.0f", v)
	case math.Abs(v) >= 1:
		return fmt.Sprintf("%.2f", v)
	default:
		return fmt.Sprintf("%.3f", v)
	}
}

// Ms converts a duration to float milliseconds, the unit of latency rows.
func Ms(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }

// Percentile returns the p-th percentile (0-100) of the samples, by the
// nearest-rank method. It sorts a copy.
func Percentile(samples []time.Duration, p float64) time.Duration {
	if len(samples) == 0 {
		return 0
	}
	s := slices.Clone(samples)
	slices.Sort(s)
	rank := int(math.Ceil(p/100*float64(len(s)))) - 1
	rank = max(0, min(rank, len(s)-1))
	return s[rank]
}
