package registryapi

import (
	"bufio"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/registry"
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
func (h *Handler) watch(w http.ResponseWriter, r *http.Request) {
	params, ok := httpapi.CheckQuery(w, r, "namespace", "component", "endpoint", "since")
	if !ok {
		return
	}
	q, ok := query(w, params)
	if !ok {
		return
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
			return
		}
		opts = append(opts, registry.FromRevision(rev))
	}
	ctx := r.Context()
	wt, err := h.reg.Watch(ctx, q, opts...)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	defer wt.Close()
	h.m.watches.Inc()
	defer h.m.watches.Dec()

	hdr := w.Header()
	hdr.Set("Content-Type", "text/event-stream")
	hdr.Set("Cache-Control", "no-cache")
	hdr.Set("X-Accel-Buffering", "no")
	w.WriteHeader(http.StatusOK)
	rc := http.NewResponseController(w)
	bw := bufio.NewWriter(w)
	flush := func() error {
		if err := bw.Flush(); err != nil {
			return err
		}
		return rc.Flush()
	}
	fmt.Fprint(bw, "retry: 1000\n\n")
	if flush() != nil {
		return
	}
	for {
		nctx, cancel := context.WithTimeout(ctx, h.keepAlive)
		b, err := wt.Next(nctx)
		cancel()
		switch {
		case ctx.Err() != nil:
			return
		case errors.Is(err, context.DeadlineExceeded):
			fmt.Fprint(bw, ": keep-alive\n\n")
		case err != nil:
			writeSSE(bw, "error", "", ErrorResponse{Code: "unavailable", Message: err.Error()})
			_ = flush()
			return
		default:
			writeBatch(bw, b)
		}
		if flush() != nil {
			return
		}
	}
}

func writeBatch(w *bufio.Writer, b registry.Batch) {
	id := strconv.FormatInt(b.Revision, 10)
	switch b.Kind {
	case registry.Snapshot:
		ins := make([]beacon.Instance, 0, len(b.Events))
		for _, e := range b.Events {
			ins = append(ins, e.Instance)
		}
		writeSSE(w, "snapshot", id, SnapshotMessage{Revision: b.Revision, Instances: ins})
	case registry.Stale:
		msg := "backend unreachable"
		if b.Err != nil {
			msg = b.Err.Error()
		}
		writeSSE(w, "stale", "", StaleMessage{Error: msg})
	default:
		if len(b.Events) == 0 {
			writeSSE(w, "synced", id, SyncedMessage{Revision: b.Revision})
			return
		}
		for i, e := range b.Events {
			eid := ""
			if i == len(b.Events)-1 {
				eid = id
			}
			writeSSE(w, e.Type.String(), eid, EventMessage{Event: e, Batch: b.Kind.String()})
		}
	}
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
