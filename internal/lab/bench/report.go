package bench

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"log/slog"
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
	// Against names the baseline ("raw etcd" when empty): "direct",
	// "etcd grpc-proxy", "txn-put ceiling", ...
	Against string `json:"against,omitempty"`
	// NoBaseline marks a figure measured for Beacon alone (the baseline
	// and its name print as "-").
	NoBaseline bool `json:"no_baseline,omitempty"`
	// Runs is how many measurements the figures are the median of (0 or
	// 1: a single one); the Lo and Hi fields are then their spread, and
	// RatioLo and RatioHi the spread of the per-run ratios (Beacon and
	// baseline measured in the same round).
	Runs       int     `json:"runs,omitempty"`
	BeaconLo   float64 `json:"beacon_lo,omitempty"`
	BeaconHi   float64 `json:"beacon_hi,omitempty"`
	BaselineLo float64 `json:"baseline_lo,omitempty"`
	BaselineHi float64 `json:"baseline_hi,omitempty"`
	RatioLo    float64 `json:"ratio_lo,omitempty"`
	RatioHi    float64 `json:"ratio_hi,omitempty"`
}

// Spread fills row with the medians of paired runs (beacon[i] and
// baseline[i] measured in round i) and their spread. Runs without a
// baseline (0) are left out of the ratios.
func Spread(row Row, beacon, baseline []float64) Row {
	row.Runs = max(len(beacon), len(baseline))
	row.Beacon, row.BeaconLo, row.BeaconHi = medianSpread(beacon)
	row.Baseline, row.BaselineLo, row.BaselineHi = medianSpread(baseline)
	var ratios []float64
	for i := range min(len(beacon), len(baseline)) {
		if baseline[i] != 0 {
			ratios = append(ratios, beacon[i]/baseline[i])
		}
	}
	if len(ratios) > 1 {
		_, row.RatioLo, row.RatioHi = medianSpread(ratios)
	}
	return row
}

// medianSpread returns the median (the lower middle one of an even count),
// the smallest and the largest value.
func medianSpread(v []float64) (med, lo, hi float64) {
	if len(v) == 0 {
		return 0, 0, 0
	}
	s := slices.Clone(v)
	slices.Sort(s)
	return s[(len(s)-1)/2], s[0], s[len(s)-1]
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
	// BaselineName names the baseline of rows that name none (Row.Against);
	// "raw etcd" when empty.
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

// WriteTable prints the report as an aligned table. A figure that is the
// median of several runs shows their spread in brackets.
func (r *Report) WriteTable(w io.Writer) error {
	fmt.Fprintf(w, "== %s ==\n", r.Scenario)
	if r.Setup != "" {
		fmt.Fprintf(w, "%s\n", r.Setup)
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintln(tw, "metric\tunit\tbeacon\tbaseline\tvs\tratio\tgoal\t")
	for _, row := range r.Rows {
		goal := "-"
		if row.Goal != 0 {
			cmp := "<="
			if row.HigherIsBetter {
				cmp = ">="
			}
			verdict := "met"
			switch {
			case math.IsNaN(row.Ratio()):
				verdict = "no baseline" // none in this run (--no-grpc-proxy) or zero: nothing to judge by
			case !row.Met():
				verdict = "MISSED"
			}
			goal = fmt.Sprintf("%s %.2fx %s", cmp, row.Goal, verdict)
		}
		ratio := "-"
		if r := row.Ratio(); !math.IsNaN(r) {
			ratio = fmt.Sprintf("%.2fx", r)
			if row.Runs > 1 && row.RatioHi != 0 {
				ratio += fmt.Sprintf(" (%.2f-%.2f)", row.RatioLo, row.RatioHi)
			}
		}
		against := row.Against
		if against == "" {
			against = r.BaselineName
		}
		if against == "" {
			against = "raw etcd"
		}
		baseline := withSpread(row.Baseline, row.BaselineLo, row.BaselineHi, row.Runs)
		if row.NoBaseline {
			baseline, against = "-", "-"
		}
		fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s\t%s\t\n", row.Metric, row.Unit,
			withSpread(row.Beacon, row.BeaconLo, row.BeaconHi, row.Runs), baseline, against, ratio, goal)
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

func withSpread(v, lo, hi float64, runs int) string {
	if runs < 2 || math.IsNaN(v) || lo == hi {
		return FormatValue(v)
	}
	return fmt.Sprintf("%s (%s-%s)", FormatValue(v), FormatValue(lo), FormatValue(hi))
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

// setDefault gives *p the value def when it is zero: in the scenarios'
// configurations, the zero value means the default.
func setDefault[T comparable](p *T, def T) {
	var zero T
	if *p == zero {
		*p = def
	}
}

// setPositive gives *p the value def when it is zero or negative.
func setPositive[T int | time.Duration](p *T, def T) {
	if *p <= 0 {
		*p = def
	}
}

// discardLogger is the logger of a configuration that gives none.
func discardLogger() *slog.Logger { return slog.New(slog.DiscardHandler) }

// cleanupContext returns a context for the work that undoes a run (revokes,
// deletes): ctx ending does not end it, so that an interrupted run still
// removes what it made, but it ends grace after ctx does, so that an
// interrupt is never held up by a store that no longer answers. Cancel
// releases it.
func cleanupContext(ctx context.Context, grace time.Duration) (context.Context, context.CancelFunc) {
	cctx, cancel := context.WithCancel(context.WithoutCancel(ctx))
	stop := context.AfterFunc(ctx, func() { time.AfterFunc(grace, cancel) })
	return cctx, func() { stop(); cancel() }
}
