package drill

import "testing"

// TestSessionTrackerClassifiesEachLossByItsCause pins how a session's state
// changes count: a loss is classified by the event that reported it, not by
// the reports on the recovery's new lease that follow it in the same state
// (unconfirmed, then confirmed again with no error).
func TestSessionTrackerClassifiesEachLossByItsCause(t *testing.T) {
	notFound := sessionEvent{state: "lost", notFound: true, err: "registry: lease lost; re-registering: store: lease not found"}
	unconfirmed := func(state, lease string) sessionEvent {
		return sessionEvent{state: state, lease: lease, unconfirmed: true, err: "registry: no keep-alive answered for a whole TTL"}
	}
	for _, c := range []struct {
		name   string
		events []sessionEvent
		want   leaseCounts
	}{{
		name: "revoked although renewed, the recovery's lease unconfirmed a while",
		events: []sessionEvent{{state: "active", lease: "a"}, notFound, unconfirmed("lost", ""), {state: "lost"},
			{state: "recovered", lease: "b"}},
		want: leaseCounts{revoked: 1},
	}, {
		name:   "not found after a whole TTL unanswered",
		events: []sessionEvent{{state: "active", lease: "a"}, unconfirmed("active", "a"), notFound, {state: "lost"}, {state: "recovered", lease: "b"}},
		want:   leaseCounts{lost: 1, unconfirmed: 1},
	}, {
		name:   "given up for another reason",
		events: []sessionEvent{{state: "active", lease: "a"}, {state: "lost", err: "permission denied"}, {state: "recovered", lease: "b"}},
		want:   leaseCounts{lost: 1},
	}, {
		name:   "reported lost, recovered with the same lease",
		events: []sessionEvent{{state: "active", lease: "a"}, notFound, {state: "recovered", lease: "a"}},
		want:   leaseCounts{falseLoss: 1},
	}, {
		name:   "unconfirmed, then confirmed",
		events: []sessionEvent{{state: "active", lease: "a"}, unconfirmed("active", "a"), {state: "active", lease: "a"}},
		want:   leaseCounts{unconfirmed: 1},
	}, {
		name:   "still lost",
		events: []sessionEvent{{state: "active", lease: "a"}, notFound, unconfirmed("lost", "")},
		want:   leaseCounts{open: 1},
	}} {
		t.Run(c.name, func(t *testing.T) {
			var st pathStats
			tr := &sessionTracker{who: "session"}
			for _, e := range c.events {
				tr.observe(e, &st)
			}
			st.notes = nil
			if st.leaseCounts.lost != c.want.lost || st.revoked != c.want.revoked || st.falseLoss != c.want.falseLoss ||
				st.unconfirmed != c.want.unconfirmed || st.open != c.want.open {
				t.Errorf("counts %+v, want %+v", st.leaseCounts, c.want)
			}
		})
	}
}
