package etcdwatch

import "time"

// Phase is where the watch's etcd watches are (doc.go draws the
// transitions).
type Phase int

const (
	// Opening: the current etcd watch is requested; clientv3's Watch has
	// not returned (on a hung member it never does).
	Opening Phase = iota
	// Watching: the current etcd watch runs alone.
	Watching
	// Replacing: a replacement from Known was requested beside the current
	// watch, which runs on (so that nothing it delivers meanwhile is lost).
	Replacing
	// Syncing: etcd created the replacement; it takes over at its first
	// progress notification or events (etcd syncs it within 100 ms), or is
	// dropped if Known turned out compacted.
	Syncing
)

func (p Phase) String() string {
	switch p {
	case Opening:
		return "opening"
	case Watching:
		return "watching"
	case Replacing:
		return "replacing"
	case Syncing:
		return "syncing"
	}
	return "phase(?)"
}

// State is one self-healing watch without its I/O: Run feeds it what etcd
// says and the clock's ticks, and does what it answers. Each method is one
// transition of doc.go's drawing.
type State struct {
	Position
	Silence Silence
	phase   Phase
	from    int64 // the replacement's start (Replacing, Syncing)
	lagged  int   // silences in a row taken for etcd lagging (Lagged)
}

// MaxLagged is how many silences in a row a watch takes for etcd lagging
// (Config.BeforeSilent) before it ends all the same: at the default 4 s
// timeout, a watch that hears nothing for about 20 s ends whatever the
// probes found.
const MaxLagged = 4

// New returns the state of a watch opened from rev (0: now) at now, with
// the silence timeout silence (0 or less: no silence check).
func New(rev int64, silence time.Duration, now time.Time) *State {
	s := &State{Position: Position{Next: rev, OpenedAt: rev}, Silence: Silence{Timeout: silence}}
	s.Silence.Start(now)
	return s
}

// Phase is the current phase.
func (s *State) Phase() Phase { return s.phase }

// Opened is the transition: clientv3's Watch returned the current watch's channel (which
// follows New or Reopen: the phase is Opening).
func (s *State) Opened() { s.phase = Watching }

// Reopen is the transition: the current watch is replaced by one from rev (Open again).
func (s *State) Reopen(rev int64) {
	s.OpenedAt, s.phase = rev, Opening
}

// Tick is what the silence check at one tick asks for.
type Tick struct {
	Ask            bool          // a progress request on the current watch's stream
	AskReplacement bool          // a progress request on the replacement's stream
	ReplaceFrom    int64         // > 0: open a replacement from this revision (its own stream)
	Silent         time.Duration // > 0: the watch is silent for this long: end it
}

// OnTick runs the silence check at now.
func (s *State) OnTick(now time.Time) Tick {
	var t Tick
	// Until etcd has synced the replacement (every 100 ms), which it
	// answers only then.
	t.AskReplacement = s.phase == Syncing
	switch s.Silence.Check(now) {
	case Silent:
		t.Silent = s.Silence.Quiet(now)
	case Ask:
		t.Ask = s.phase == Watching
	case ReplaceAhead:
		if s.phase == Watching {
			t.ReplaceFrom = s.replace(s.ReplaceFrom())
		}
	}
	return t
}

// replace enters Replacing with a replacement from rev (0: none, the
// phase is unchanged).
func (s *State) replace(rev int64) int64 {
	if rev > 0 {
		s.phase, s.from = Replacing, rev
	}
	return rev
}

// OnHeard is the transition: etcd said something at now, on either watch, or the consumer
// took a response.
func (s *State) OnHeard(now time.Time) {
	s.Silence.Heard(now)
	s.lagged = 0
}

// Lagged is the transition: a silence at now was etcd lagging (no other
// member would serve the watch better: Config.BeforeSilent). It reports whether the watch carries on — its silence
// measured again from now — which it does MaxLagged times in a row; after
// that the silence stands.
func (s *State) Lagged(now time.Time) bool {
	if s.lagged >= MaxLagged {
		return false
	}
	s.lagged++
	s.Silence.Start(now)
	return true
}

// OnReplacementCreated is the transition: etcd created the replacement at rev.
func (s *State) OnReplacementCreated(rev int64) {
	s.Reported(rev)
	s.phase = Syncing
}

// OnReplacementCompacted is the transition: the replacement's start is compacted (etcd's
// revision moved on since it last reported one: other keys were written,
// then compacted). The current watch missed nothing and stays; its start
// is now within etcd's revision (header, at or above the compaction),
// unless it is still ahead (a watch from a later revision): then a
// replacement from header (Position.ReplaceFrom), returned (0: none).
func (s *State) OnReplacementCompacted(header int64) int64 {
	s.Reported(header)
	s.phase = Watching
	return s.replace(s.ReplaceFrom())
}

// OnReplacementSynced is the transition: the replacement answered (progress or events): it
// takes over, and the caller stops the watch it replaces. The response is
// then the current watch's.
func (s *State) OnReplacementSynced() {
	s.OpenedAt, s.phase = s.from, Watching
}

// OnCompacted is the transition: the current watch's start is compacted
// at compactRev, in a response at revision header. If only revisions
// below Next are gone (it was opened below Next), it returns the revision
// to open the watch from again (Position.Compacted: Next, or Known when
// Next is ahead of etcd); otherwise the watch has lost events and ends
// with the error.
func (s *State) OnCompacted(compactRev, header int64) (reopen int64, err error) {
	from, err := s.Compacted(compactRev, header)
	if err != nil {
		return 0, err
	}
	s.Reopen(from)
	return from, nil
}
