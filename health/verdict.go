package health

import (
	"time"

	"github.com/beaconplane/beacon"
)

// Status is a check's verdict on an instance.
type Status string

// The verdicts. An instance whose check has not yet failed Fall times in
// a row is served (Unknown and Passing): checks take instances out, they
// never hold a new one back (fail-open).
const (
	Unknown Status = "unknown"
	Passing Status = "passing"
	Failing Status = "failing"
)

// verdict turns a check's results into its status with rise and fall
// thresholds: Fall failures in a row take a served instance out, Rise
// passes in a row bring a failing one back, and anything shorter changes
// nothing (which damps an instance flapping faster than the thresholds).
// The thresholds count intervals, not results: a result counts toward
// one only when it comes at least the shortest wait between two probes
// (0.9 interval) after the last one that counted. So a status a gRPC
// server pushes and the Check just after it, or two Checks brought close
// by their jitter, count once, and Fall failures in a row span at least
// Fall-1 such waits, whatever the kind.
//
//	Unknown --pass--> Passing
//	Unknown --fall failures in a row--> Failing
//	Passing --fall failures in a row--> Failing
//	Failing --rise passes in a row--> Passing
type verdict struct {
	rise, fall int
	status     Status
	streak     int // results in a row that disagree with status, and counted
	reason     error
	spacing    time.Duration // how far apart two results must come to count twice
	counted    time.Time     // when the streak's last counted result came
}

// newVerdict is the verdict of c. A TTL check's has no thresholds: one
// report passes it, one report too old fails it.
func newVerdict(c beacon.Check) verdict {
	c = c.WithDefaults()
	if c.Kind == beacon.CheckTTL {
		return verdict{rise: 1, fall: 1, status: Unknown}
	}
	return verdict{rise: c.Rise, fall: c.Fall, status: Unknown, spacing: nextWait(c.Interval, 0)}
}

// observe records one result (nil: passed) that came at at, and reports
// whether the status changed.
func (v *verdict) observe(result error, at time.Time) bool {
	pass := result == nil
	if !pass {
		v.reason = result
	}
	if pass && v.status == Unknown {
		v.status, v.streak, v.reason = Passing, 0, nil
		return true
	}
	if served := v.status != Failing; pass == served {
		v.streak = 0
		return false
	}
	if v.streak > 0 && at.Sub(v.counted) < v.spacing {
		return false // in the interval of the last one counted
	}
	v.streak, v.counted = v.streak+1, at
	need := v.fall
	if pass {
		need = v.rise
	}
	if v.streak < need {
		return false
	}
	v.streak = 0
	if pass {
		v.status, v.reason = Passing, nil
	} else {
		v.status = Failing
	}
	return true
}
