package proxy

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"time"

	"github.com/beaconplane/beacon/internal/etcdwatch"
	clientv3 "go.etcd.io/etcd/client/v3"
	"google.golang.org/grpc/connectivity"
)

// Upstream watch silence.
//
// The upstream watches all run on one member at a time, through a client
// of that member alone, so that the proxy knows which member feeds them.
// A member can fail in a way no connection error shows: hung (SIGSTOP, a
// stalled disk, a wedged process) while the kernel still accepts its TCP
// traffic. So the hub notices silence itself: a gRPC watch stream from
// which nothing arrived for WatchSilenceTimeout/2 is sent a progress
// request, which etcd answers at once when the stream's watches are
// synced; if nothing arrives within another WatchSilenceTimeout/2, the
// member is silent. The hub then benches it (as a failed endpoint, for
// forwarding too) and moves every upstream watch to another member, from
// the revision each has fully delivered: clients see no gap and no
// duplicate. When no other member is available, the client watchers are
// cancelled with a reason instead of being left silently stale (they
// re-create their watches, which fail clearly until a member answers).
// A member that drops out of the endpoint list (benched after a request
// failed on it, or removed from the cluster) is left the same way, and a
// connection that breaks moves the watches at once.

// startMember points the hub at a usable member; it is called once the
// proxy has found the cluster.
func (h *watchHub) startMember() error {
	avail := h.p.dir.available()
	if len(avail) == 0 {
		return errors.New("proxy: no etcd member available for watches")
	}
	cli, err := h.memberClient(avail[0])
	if err != nil {
		return err
	}
	h.mu.Lock()
	h.member, h.cli, h.w = avail[0], cli, cli.Watcher
	h.mu.Unlock()
	h.spawn(func() { h.watchConn(avail[0], cli) })
	h.spawn(h.monitor)
	return nil
}

// watchConn moves the watches off member as soon as its connection fails
// (after having worked), without waiting for the silence check.
func (h *watchHub) watchConn(member string, cli *clientv3.Client) {
	conn := cli.ActiveConnection()
	ready := false
	for {
		st := conn.GetState()
		switch st {
		case connectivity.Ready:
			ready = true
		case connectivity.TransientFailure:
			if ready {
				h.leave(member, fmt.Errorf("proxy: the connection to etcd member %s failed", member), false)
				return
			}
		case connectivity.Shutdown:
			return
		}
		if !conn.WaitForStateChange(cli.Ctx(), st) {
			return // the client was closed
		}
	}
}

// memberClient connects to one member only.
func (h *watchHub) memberClient(member string) (*clientv3.Client, error) {
	cli, err := h.p.etcdClient([]string{member})
	if err != nil {
		return nil, fmt.Errorf("proxy: connect to %s for watches: %w", member, err)
	}
	return cli, nil
}

// spawn runs fn in a goroutine the hub owns, unless the hub is closed
// (close waits for them).
func (h *watchHub) spawn(fn func()) bool {
	h.mu.Lock()
	defer h.mu.Unlock()
	if h.closed {
		return false
	}
	h.wg.Go(fn)
	return true
}

// kickMember asks the monitor to check the hub's member (the director's
// endpoints changed).
func (h *watchHub) kickMember() {
	select {
	case h.kick <- struct{}{}:
	default:
	}
}

// monitor probes silent watch streams and moves the watches off a member
// that is silent, gone from the endpoints, or unreachable.
func (h *watchHub) monitor() {
	timeout := h.p.cfg.WatchSilenceTimeout
	tick := time.NewTicker(max(timeout/8, 10*time.Millisecond))
	defer tick.Stop()
	for {
		select {
		case <-h.ctx.Done():
			return
		case <-tick.C:
			if timeout > 0 {
				h.checkSilence(time.Now(), timeout)
			}
		case <-h.kick:
		}
		h.checkMember()
	}
}

// checkSilence runs the silence check (etcdwatch.Silence) of each gRPC
// watch stream: progress requests to streams quiet for timeout/2, the
// watches ahead of etcd's revision opened again from the last revision
// etcd reported when a request stays unanswered, and the member declared
// silent when a stream hears nothing for the timeout.
func (h *watchHub) checkSilence(now time.Time, timeout time.Duration) {
	h.mu.Lock()
	streams := h.streamsLocked()
	for g := range h.probes {
		if streams[g] == nil {
			delete(h.probes, g)
		}
	}
	var ask []context.Context
	silent := time.Duration(0)
	for g, q := range streams {
		pr := h.probes[g]
		if pr == nil {
			pr = &etcdwatch.Silence{Timeout: timeout}
			h.probes[g] = pr
		}
		pr.Heard(q.heard)
		switch pr.Check(now) {
		case etcdwatch.Ask:
			ask = append(ask, q.ctx)
		case etcdwatch.ReplaceAhead:
			// Not at once: when etcd's revision moved on (other keys
			// were written) the request is answered, and the revision
			// last reported may have been compacted since — the watch
			// opened again would be (reopenCompacted then opens it
			// again). (Not u.restart: the silence is still measured
			// from the last response, so that a hung member is noticed
			// as soon.)
			h.replaceAheadLocked(g, q.known)
		case etcdwatch.Silent:
			silent = max(silent, pr.Quiet(now))
		}
	}
	w, member := h.w, h.member
	h.mu.Unlock()
	for _, ctx := range ask {
		h.spawn(func() {
			// RequestProgress finds the stream by ctx's metadata.
			pctx, cancel := context.WithTimeout(ctx, timeout/2)
			defer cancel()
			_ = w.RequestProgress(pctx)
		})
	}
	if silent > 0 {
		h.p.m.watchSilences.Inc()
		err := fmt.Errorf("proxy: etcd member %s sent nothing on a watch stream for %v, not even an answer to a progress request", member, silent.Round(time.Millisecond))
		h.p.log.Warn("upstream watch silent; moving the watches to another member", "member", member, "silent", silent.Round(time.Millisecond))
		h.leave(member, err, true)
	}
}

// quietStream is what the silence check needs of one gRPC watch stream.
type quietStream struct {
	ctx   context.Context // a context whose metadata selects the stream
	heard time.Time       // when a response last came on it
	known int64           // the highest revision etcd reported on it
}

// streamsLocked gathers the gRPC watch streams of the upstreams; h.mu is
// held.
func (h *watchHub) streamsLocked() map[watchKey]*quietStream {
	streams := map[watchKey]*quietStream{}
	for key, ups := range h.groups {
		for _, u := range ups {
			heard := time.Unix(0, u.heard.Load())
			u.mu.Lock()
			known := u.pos.Known
			u.mu.Unlock()
			q := streams[key.group()]
			if q == nil {
				streams[key.group()] = &quietStream{ctx: u.context(), heard: heard, known: known}
				continue
			}
			if heard.After(q.heard) {
				q.heard = heard
			}
			q.known = max(q.known, known)
		}
	}
	return streams
}

// replaceAheadLocked opens again, from known (the last revision etcd
// reported on stream g), each watch of g that starts ahead of it
// (etcdwatch.Position.ReplaceFrom): etcd answers the stream no progress
// request while one is. Its created response is the answer. Unlike
// etcdwatch.State, which lets the current watch run on until its
// replacement is synced, the watch is replaced at once: on a shared
// stream, the one ahead would keep every other watch's progress request
// unanswered. h.mu is held.
func (h *watchHub) replaceAheadLocked(g watchKey, known int64) {
	for key, us := range h.groups {
		if key.group() != g {
			continue
		}
		for _, u := range us {
			u.mu.Lock()
			if !u.closed {
				u.pos.Reported(known)
				if from := u.pos.ReplaceFrom(); from > 0 {
					u.reopenLocked(h.w, from)
				}
			}
			u.mu.Unlock()
		}
	}
}

// leave benches member (if it is still the hub's) and moves the watches;
// silent: member sent nothing for the silence timeout.
func (h *watchHub) leave(member string, err error, silent bool) {
	if u, perr := url.Parse(member); perr == nil {
		h.p.dir.fail(u.Host, err)
	}
	h.mu.Lock()
	if h.member == member {
		h.leaving, h.silent = err, silent
	}
	h.mu.Unlock()
	h.checkMember()
}

// checkMember moves the watches when the hub's member is no longer an
// available endpoint, or its connection failed.
func (h *watchHub) checkMember() {
	avail := h.p.dir.available()
	h.mu.Lock()
	if h.closed || h.cli == nil {
		h.mu.Unlock()
		return
	}
	member, why, silent := h.member, h.leaving, h.silent
	h.mu.Unlock()
	listed := slices.Contains(avail, member)
	if why == nil {
		if listed {
			return
		}
		why = fmt.Errorf("proxy: etcd member %s is no longer an available endpoint", member)
	}
	var next string
	for _, ep := range avail {
		if ep != member {
			next = ep
			break
		}
	}
	if next == "" {
		if !silent && (len(avail) == 0 || listed) {
			// No other member, and this one has not been silent for the
			// timeout (its connection failed, or it was benched: every
			// member may be down, or restarting). The watches stay: their
			// client reconnects to the member and resumes each from the
			// revision it needs, they move as soon as another member is
			// available, and the silence check still cancels them if
			// nothing comes within its bound. A member that answers again
			// keeps them.
			if listed {
				h.mu.Lock()
				cli := h.cli
				back := h.member == member && h.leaving != nil
				if back {
					h.leaving = nil
				}
				h.mu.Unlock()
				if back {
					// Its connection is watched again.
					h.spawn(func() { h.watchConn(member, cli) })
				}
			}
			return
		}
		// Nowhere to go: tell the clients rather than leave them stale.
		h.endAll(fmt.Sprintf("%v; no other etcd member is available: re-create the watch", why))
		return
	}
	cli, err := h.memberClient(next)
	if err != nil {
		h.p.log.Warn("cannot connect to another member for watches", "member", next, "err", err)
		return
	}
	h.mu.Lock()
	if h.closed {
		h.mu.Unlock()
		_ = cli.Close()
		return
	}
	old := h.cli
	h.member, h.cli, h.w, h.leaving, h.silent = next, cli, cli.Watcher, nil, false
	clear(h.probes)
	n := 0
	for _, ups := range h.groups {
		for _, u := range ups {
			u.restart(cli.Watcher)
			n++
		}
	}
	h.mu.Unlock()
	h.p.m.watchMoves.Inc()
	h.p.log.Info("upstream watches moved", "from", member, "to", next, "watches", n, "reason", why)
	if !h.spawn(func() { _ = old.Close() }) {
		_ = old.Close()
	}
	h.spawn(func() { h.watchConn(next, cli) })
}

// endAll cancels every upstream watch, and so every client watcher, with
// reason.
func (h *watchHub) endAll(reason string) {
	h.mu.Lock()
	var ups []*upstream
	for _, g := range h.groups {
		ups = append(ups, g...)
	}
	h.leaving, h.silent = nil, false
	h.mu.Unlock()
	if len(ups) > 0 {
		h.p.log.Warn("ending the client watches", "watches", len(ups), "reason", reason)
	}
	for _, u := range ups {
		u.end(nil, 0, reason)
	}
}
