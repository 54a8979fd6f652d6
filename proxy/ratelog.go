package proxy

import (
	"log/slog"
	"sync"
	"time"
)

// failLogEvery is how often a failure that keeps repeating is summed up
// at WARN.
const failLogEvery = 10 * time.Second

// failLog decides how to log a failure that is retried, so that it is
// logged at a bounded rate: the first of a run at WARN, each retry at
// DEBUG with a WARN summary (failures, time) at most every failLogEvery,
// and the end of the run once at INFO. A proxy that cannot reach its
// cluster retries every second or faster; one line per retry would bury
// everything else. The caller logs, with its own constant message.
type failLog struct {
	every time.Duration
	now   func() time.Time

	mu       sync.Mutex
	failures int       // in the current run (0: not failing)
	since    time.Time // the run's first failure
	warned   time.Time // the run's last WARN
}

func newFailLog() *failLog { return &failLog{every: failLogEvery, now: time.Now} }

// failed records one failure and returns the level to log it at and the
// attributes to add (the count and duration of the run after its first).
func (f *failLog) failed() (slog.Level, []any) {
	f.mu.Lock()
	defer f.mu.Unlock()
	now := f.now()
	f.failures++
	if f.failures == 1 {
		f.since, f.warned = now, now
		return slog.LevelWarn, nil
	}
	attrs := []any{"failures", f.failures, "failing_for", now.Sub(f.since).Round(time.Millisecond).String()}
	if now.Sub(f.warned) >= f.every {
		f.warned = now
		return slog.LevelWarn, attrs
	}
	return slog.LevelDebug, attrs
}

// ok ends a run of failures: it reports whether there was one, and its
// count and duration as attributes.
func (f *failLog) ok() ([]any, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	n := f.failures
	f.failures = 0
	if n == 0 {
		return nil, false
	}
	return []any{"failures", n, "failed_for", f.now().Sub(f.since).Round(time.Millisecond).String()}, true
}

// onceLog decides the level of a problem with one subject (an endpoint
// URL): WARN the first time, DEBUG after, since each refresh or retry
// finds the same misconfiguration again.
type onceLog struct {
	mu   sync.Mutex
	seen map[string]bool
}

// maxOnceSubjects bounds what onceLog remembers (member lists are small;
// past this it starts over).
const maxOnceSubjects = 1024

func newOnceLog() *onceLog { return &onceLog{seen: map[string]bool{}} }

// level returns WARN the first time (what, subject) is seen, DEBUG after.
func (o *onceLog) level(what, subject string) slog.Level {
	key := what + "\x00" + subject
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.seen[key] {
		return slog.LevelDebug
	}
	if len(o.seen) >= maxOnceSubjects {
		clear(o.seen)
	}
	o.seen[key] = true
	return slog.LevelWarn
}
