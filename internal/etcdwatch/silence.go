package etcdwatch

import "time"

// Verdict is what a silence check asks of the watch's owner.
type Verdict int

const (
	// Listening: something was heard within half the timeout, or a
	// progress request is out and not yet due again: nothing to do.
	Listening Verdict = iota
	// Ask: quiet for half the timeout: send a progress request on the
	// stream (etcd answers it once the stream's watches are synced).
	Ask
	// ReplaceAhead: the progress request is unanswered after an eighth of
	// the timeout: a watch that starts ahead of the last revision etcd
	// reported is never answered (etcd 3.6.8 and later) and must be
	// opened again from that revision (Position.Ahead).
	ReplaceAhead
	// Silent: nothing for the whole timeout, and the first progress request
	// of this quiet spell unanswered for half of it: the member hangs, is
	// cut off, or the cluster is down. The watch must end (or move) and
	// say so.
	Silent
)

func (v Verdict) String() string {
	switch v {
	case Listening:
		return "listening"
	case Ask:
		return "ask"
	case ReplaceAhead:
		return "replace-ahead"
	case Silent:
		return "silent"
	}
	return "verdict(?)"
}

// Silence is the silence check of one gRPC watch stream: it is told when
// something was heard and, on each Check, says what to do. It reads no
// clock: the owner passes the time, so that tests drive it.
//
// The zero Silence with a Timeout of zero or less never says anything but
// Listening.
type Silence struct {
	Timeout time.Duration
	heard   time.Time // when etcd last said something on the stream
	asked   time.Time // when a progress request was last sent, unanswered (zero: none)
	first   time.Time // when the first of them was sent
	replace bool      // ReplaceAhead said since the stream was last heard
}

// Start begins the check at now (a new watch, or one moved to another
// member: its silence is measured from now).
func (s *Silence) Start(now time.Time) {
	s.heard, s.asked, s.first, s.replace = now, time.Time{}, time.Time{}, false
}

// Heard records that etcd said something at t (a response, or a consumer
// that made the watch wait: time spent waiting for it is not silence). It
// answers the progress request out, if any.
func (s *Silence) Heard(t time.Time) {
	if t.After(s.heard) {
		s.heard = t
	}
	if !s.asked.IsZero() && !s.heard.Before(s.asked) {
		s.asked, s.first, s.replace = time.Time{}, time.Time{}, false
	}
}

// LastHeard is when etcd last said something.
func (s *Silence) LastHeard() time.Time { return s.heard }

// Quiet is how long the stream has been quiet at now.
func (s *Silence) Quiet(now time.Time) time.Duration { return now.Sub(s.heard) }

// Check gives the verdict at now; the owner checks every eighth of the
// timeout, so that a silent stream is noticed within 1.25 timeouts.
func (s *Silence) Check(now time.Time) Verdict {
	t := s.Timeout
	switch {
	case t <= 0 || now.Sub(s.heard) < t/2:
		return Listening
	case s.asked.IsZero():
		s.asked, s.first = now, now
		return Ask
	case now.Sub(s.first) >= t/2:
		return Silent
	case !s.replace && now.Sub(s.asked) >= t/8:
		s.replace = true
		return ReplaceAhead
	case now.Sub(s.asked) >= t/4:
		s.asked = now // asked again: a request may be lost with its stream
		return Ask
	}
	return Listening
}
