package registryapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// SnapshotMessage is the data of an SSE "snapshot" event: the whole state.
type SnapshotMessage struct {
	Revision  int64             `json:"revision"`
	Instances []beacon.Instance `json:"instances"`
}

// EventMessage is the data of an SSE "added", "updated" or "removed" event.
type EventMessage struct {
	beacon.Event
	// Batch is "changes", or "resync" for differences found by re-listing
	// after a reconnect or a compaction.
	Batch string `json:"batch"`
}

// SyncedMessage is the data of an SSE "synced" event: a resumed stream is
// up to date at Revision with no change to report.
type SyncedMessage struct {
	Revision int64 `json:"revision"`
}

// StaleMessage is the data of an SSE "stale" event: the server lost its
// backend and retries; the view may be out of date until the next events.
type StaleMessage struct {
	Error string `json:"error"`
}

// watch streams a registry watch as Server-Sent Events:
//
//	event: snapshot   id: <rev>   the whole state (first, unless resumed)
//	event: added|updated|removed  one per change; the last of a batch
//	                              carries id: <rev>
//	event: synced     id: <rev>   a resumed stream with nothing to report
//	event: stale                  the backend is unreachable; retrying
//
// A client resumes with Last-Event-ID (or ?since=) set to the last id it
// received; if those changes are gone it gets a fresh snapshot.
//
// Neither side stays silent: an idle stream carries a comment every
// KeepAliveInterval, so a client that hears nothing for two intervals knows
// the stream is dead; and a client that stops reading (a vanished peer, a
// stuck proxy) is dropped once a write has waited an interval and
// streamWriteTimeout, so that a dead stream never holds a registry watcher.
// The bound is on progress, not on the size of what is sent: a large
// snapshot is written in pieces of writeChunk bytes, each with its own
// deadline, so a client that reads slowly but steadily gets all of it.
func (h *Handler) watch(w http.ResponseWriter, r *http.Request) {
	q, opts, ok := watchRequest(w, r)
	if !ok {
		return
	}
	reg, ok := h.discoverer(w, r)
	if !ok {
		return
	}
	release, ok := h.quota.acquireWatch(w, h.quota.client(r))
	if !ok {
		return
	}
	defer release()
	ctx := r.Context()
	wt, err := reg.Watch(ctx, q, opts...)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer wt.Close()

	// The first batch decides the status: a watch the user may not make
	// is refused with 401/403 instead of a stream of stale events.
	first, err := h.next(ctx, wt)
	switch {
	case closing(ctx):
		writeError(w, http.StatusServiceUnavailable, "unavailable", serverClosing)
		return
	case ctx.Err() != nil:
		return
	case err == nil && first.Kind == registry.Stale && refusal(first.Err):
		h.fail(w, r, first.Err)
		return
	case err != nil && !errors.Is(err, context.DeadlineExceeded):
		h.fail(w, r, err)
		return
	}
	h.m.watches.Inc()
	defer h.m.watches.Dec()
	var firstBatch *registry.Batch
	if err == nil {
		firstBatch = &first
	}
	h.stream(w, r, wt, firstBatch)
}

// watchRequest reads a watch request: its query, and the revision to
// resume from (Last-Event-ID, else ?since=). It answers the request
// itself when it is not one it can serve.
func watchRequest(w http.ResponseWriter, r *http.Request) (beacon.Query, []registry.WatchOption, bool) {
	if !httpapi.Accepts(r, "text/event-stream") {
		// It was streamed anyway, to a client that asked for JSON.
		writeError(w, http.StatusNotAcceptable, "not_acceptable", fmt.Sprintf(
			"Accept %q: this endpoint streams Server-Sent Events: send Accept: text/event-stream (or no Accept); for the instances as one JSON answer, GET %s",
			strings.Join(r.Header.Values("Accept"), ", "), InstancesPath))
		return beacon.Query{}, nil, false
	}
	params, ok := httpapi.CheckQuery(w, r, "namespace", "component", "endpoint", "since")
	if !ok {
		return beacon.Query{}, nil, false
	}
	q, ok := query(w, params)
	if !ok {
		return beacon.Query{}, nil, false
	}
	since := r.Header.Get("Last-Event-ID")
	if since == "" {
		since = params["since"]
	}
	var opts []registry.WatchOption
	if since != "" {
		rev, err := strconv.ParseInt(since, 10, 64)
		if err != nil || rev < 0 {
			writeError(w, http.StatusBadRequest, "invalid_argument",
				fmt.Sprintf("Last-Event-ID / since %q: want the revision (an integer) of the last event received", since))
			return beacon.Query{}, nil, false
		}
		opts = append(opts, registry.FromRevision(rev))
	}
	return q, opts, true
}

// stream writes the watch's batches as Server-Sent Events, first (when
// not nil) first, with keep-alives while nothing happens, until the
// request ends, the client stops taking writes, or the watch fails.
func (h *Handler) stream(w http.ResponseWriter, r *http.Request, wt registry.Watcher, first *registry.Batch) {
	ctx := r.Context()
	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	rc := http.NewResponseController(w)
	// A stream outlives the server's per-request deadlines: it reads
	// nothing more, and each write gets its own deadline, beyond the next
	// keep-alive.
	_ = rc.SetReadDeadline(time.Time{})
	w.WriteHeader(http.StatusOK)
	// A client that does not take a write within a keep-alive interval
	// and streamWriteTimeout is gone (or not reading): end its stream.
	// Every write to the connection is bounded, including those a large
	// batch makes before the flush.
	sw := httpapi.NewStreamWriter(ctx, w, h.keepAlive+h.writeTimeout)
	defer sw.Release()
	bw := bufio.NewWriter(sw)
	flush := func() error {
		err := bw.Flush()
		if err == nil {
			err = sw.FlushError()
		}
		if err != nil {
			h.dropped(r, err)
		}
		return err
	}
	// send writes a batch; false ends the stream (a batch it could not
	// encode, after an error event).
	send := func(b registry.Batch) bool {
		if err := writeBatch(bw, b); err != nil {
			h.log.Error("watch stream ended", "remote", r.RemoteAddr, "err", err)
			_ = flush()
			return false
		}
		return true
	}
	fmt.Fprint(bw, "retry: 1000\n\n")
	if first != nil && !send(*first) {
		return
	}
	if flush() != nil {
		return
	}
	for {
		b, err := h.next(ctx, wt)
		switch {
		case closing(ctx):
			// Said within httpapi.EndGrace, or not at all to a client
			// that does not read.
			writeSSE(bw, "error", "", ErrorResponse{Code: "unavailable", Message: serverClosing})
			_ = flush()
			return
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded):
			fmt.Fprint(bw, ": keep-alive\n\n")
		case err != nil:
			writeSSE(bw, "error", "", ErrorResponse{Code: "unavailable", Message: err.Error()})
			_ = flush()
			return
		case b.Kind == registry.Stale && refusal(b.Err):
			// Credentials changed or a role was revoked: say so and end
			// the stream, rather than report a stale view forever.
			code := "permission_denied"
			if errors.Is(b.Err, store.ErrUnauthenticated) {
				code = "unauthenticated"
			}
			writeSSE(bw, "error", "", ErrorResponse{Code: code, Message: b.Err.Error()})
			_ = flush()
			return
		default:
			if !send(b) {
				return
			}
		}
		if flush() != nil {
			return
		}
	}
}

// serverClosing is what a watch is told when the server shuts down.
const serverClosing = "the server is shutting down: watch again (with Last-Event-ID, to resume) through another server, or once this one is back"

// closing reports whether ctx ended because the server shuts down (its
// streams' base context is canceled with http.ErrServerClosed), not
// because the client went.
func closing(ctx context.Context) bool {
	return errors.Is(context.Cause(ctx), http.ErrServerClosed)
}

// dropped logs a watch stream ended because its client did not take a
// write in time (or went away).
func (h *Handler) dropped(r *http.Request, err error) {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return // the client closed the stream itself
	}
	h.log.Info("watch stream ended: the client did not take a write in time",
		"remote", r.RemoteAddr, "limit", h.keepAlive+h.writeTimeout, "err", err)
}

// streamWriteTimeout bounds one write of a watch stream to a client.
const streamWriteTimeout = 30 * time.Second

// next waits for the watch's next batch, at most one keep-alive interval.
func (h *Handler) next(ctx context.Context, wt registry.Watcher) (registry.Batch, error) {
	nctx, cancel := context.WithTimeout(ctx, h.keepAlive)
	defer cancel()
	return wt.Next(nctx)
}

// refusal reports an error that retrying will not cure: the store refused
// the credentials or the permission.
func refusal(err error) bool {
	return errors.Is(err, store.ErrPermissionDenied) || errors.Is(err, store.ErrUnauthenticated)
}

// writeBatch writes b's events; an error (a snapshot it could not encode)
// is written as an error event, and ends the stream.
func writeBatch(w *bufio.Writer, b registry.Batch) error {
	id := strconv.FormatInt(b.Revision, 10)
	switch b.Kind {
	case registry.Snapshot:
		if err := writeSnapshot(w, id, b); err != nil {
			writeSSE(w, "error", "", ErrorResponse{Code: "internal", Message: err.Error()})
			return err
		}
	case registry.Stale:
		msg := "backend unreachable"
		if b.Err != nil {
			msg = b.Err.Error()
		}
		writeSSE(w, "stale", "", StaleMessage{Error: msg})
	default:
		if len(b.Events) == 0 {
			writeSSE(w, "synced", id, SyncedMessage{Revision: b.Revision})
			return nil
		}
		for i, e := range b.Events {
			eid := ""
			if i == len(b.Events)-1 {
				eid = id
			}
			writeSSE(w, e.Type.String(), eid, EventMessage{Event: e, Batch: b.Kind.String()})
		}
	}
	return nil
}

// writeSnapshot writes a snapshot event, its data what json.Marshal of a
// SnapshotMessage gives, one instance at a time: a stream of a large
// registry holds no second copy of its instances, nor their JSON whole
// (100,000 instances are tens of MB, per stream). An instance that cannot
// be encoded (none decoded from a store can) ends the snapshot where it is
// and returns the error: an error event follows, and the stream ends.
func writeSnapshot(w *bufio.Writer, id string, b registry.Batch) error {
	fmt.Fprintf(w, "event: snapshot\nid: %s\ndata: {\"revision\":%d,\"instances\":[", id, b.Revision)
	var err error
	for i, e := range b.Events {
		var data []byte
		if data, err = json.Marshal(e.Instance); err != nil {
			err = fmt.Errorf("cannot encode instance %s: %w", e.Instance.Ref(), err)
			break
		}
		if i > 0 {
			_ = w.WriteByte(',')
		}
		_, _ = w.Write(data)
	}
	_, _ = w.WriteString("]}\n\n")
	return err
}

// writeSSE writes one event; JSON never contains a newline, so data is one
// line.
func writeSSE(w *bufio.Writer, event, id string, v any) {
	data, err := json.Marshal(v)
	if err != nil {
		data, _ = json.Marshal(ErrorResponse{Code: "internal", Message: err.Error()})
		event = "error"
	}
	fmt.Fprintf(w, "event: %s\n", event)
	if id != "" {
		fmt.Fprintf(w, "id: %s\n", id)
	}
	fmt.Fprintf(w, "data: %s\n\n", data)
}
