package v2

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"

	"github.com/beaconplane/beacon/bootstrap"
	"github.com/beaconplane/beacon/store"
)

// maxForm bounds a request body.
const maxForm = 64 << 10

// casAttempts bounds compare-and-swap retries of one write.
const casAttempts = 16

// ServeHTTP serves, relative to where the service is mounted (strip the
// mount prefix with http.StripPrefix):
//
//	GET|POST     /new[?size=N]    create a token; 200 text/plain BaseURL/<token>
//	GET          /health          200 "OK" when the store answers
//	GET          /<token>[/]      list the registrations (etcd v2 JSON)
//	GET          /<token>?wait=true&waitIndex=N&recursive=true   long-poll
//	GET          /<token>/_config/size
//	GET|PUT|DELETE /<token>/<id>  one registration; PUT ?prevExist=false creates
//	DELETE       /<token>?recursive=true   remove the token
//
// Keys API answers are etcd v2 JSON with the X-Etcd-Index header.
func (s *Service) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if s.ctx.Err() != nil {
		// etcd's error body for a server that cannot serve; clients
		// retry a 503.
		newError(EcodeRaftInternal, "discovery service is shutting down", 0).writeStatus(w, http.StatusServiceUnavailable)
		return
	}
	p := strings.TrimPrefix(r.URL.Path, "/")
	switch p {
	case "":
		if r.Method != http.MethodGet && r.Method != http.MethodHead {
			methodNotAllowed(w, "GET")
			return
		}
		w.Header().Set("Content-Type", "text/plain; charset=utf-8")
		fmt.Fprintf(w, "etcd v2 discovery service (discovery.etcd.io protocol)\n\n"+
			"Create a token:  curl '%s/new?size=3'\n"+
			"Start each etcd member with --discovery=<the URL it prints>.\n", s.cfg.BaseURL)
		return
	case "new":
		s.serveNew(w, r)
		return
	case "health":
		s.serveHealth(w, r)
		return
	}
	parts := strings.Split(strings.TrimSuffix(p, "/"), "/")
	token := parts[0]
	if bootstrap.ValidateToken(token) != nil {
		// What etcd answers for any key that does not exist.
		newError(EcodeKeyNotFound, RegistryPath+"/"+p, 0).write(w)
		return
	}
	rest := strings.Join(parts[1:], "/")
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		newError(EcodeInvalidField, "invalid form: "+err.Error(), 0).write(w)
		return
	}
	kr, verr := parseKeyRequest(r.Form, r.Method)
	if verr != nil {
		verr.write(w)
		return
	}
	k := key{token: token, rest: rest}
	switch r.Method {
	case http.MethodGet, http.MethodHead:
		s.serveGet(w, r, k, kr)
	case http.MethodPut, http.MethodPost:
		s.servePut(w, r, k, kr)
	case http.MethodDelete:
		s.serveDelete(w, r, k, kr)
	default:
		methodNotAllowed(w, "GET, PUT, DELETE")
	}
}

func methodNotAllowed(w http.ResponseWriter, allow string) {
	w.Header().Set("Allow", allow)
	http.Error(w, "Method Not Allowed", http.StatusMethodNotAllowed)
}

// key is a path under a token: rest is "" (the token directory),
// "_config", "_config/size" or a member ID.
type key struct{ token, rest string }

func (k key) v2() string {
	if k.rest == "" {
		return RegistryPath + "/" + k.token
	}
	return RegistryPath + "/" + k.token + "/" + k.rest
}

func (s *Service) storeKey(k key) string { return s.tokenPrefix(k.token) + k.rest }

// hidden reports names etcd v2 hides from listings ("_config", "_meta").
func hidden(name string) bool { return strings.HasPrefix(name, "_") }

// validMember checks the last element of a writable key.
func validMember(rest string) bool {
	if rest == "" || len(rest) > 64 || hidden(rest) || strings.Contains(rest, "/") {
		return false
	}
	for i := 0; i < len(rest); i++ {
		c := rest[i]
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '-' || c == '_' || c == '.') {
			return false
		}
	}
	return true
}

func (s *Service) serveNew(w http.ResponseWriter, r *http.Request) {
	switch r.Method {
	case http.MethodGet, http.MethodPost:
	default:
		methodNotAllowed(w, "GET, POST")
		return
	}
	r.Body = http.MaxBytesReader(w, r.Body, maxForm)
	if err := r.ParseForm(); err != nil {
		http.Error(w, "invalid form: "+err.Error(), http.StatusBadRequest)
		return
	}
	if vs := r.Form["size"]; len(vs) > 1 {
		http.Error(w, fmt.Sprintf("size given %d times (%s): give it once, e.g. /new?size=3", len(vs), strings.Join(vs, ", ")), http.StatusBadRequest)
		return
	}
	size, err := ParseSizeParam(r.FormValue("size"))
	if err != nil {
		http.Error(w, err.Error(), http.StatusBadRequest)
		return
	}
	token, err := s.CreateToken(r.Context(), size)
	if err != nil {
		s.lg.Error("creating a discovery token failed", "err", err)
		http.Error(w, "unable to generate token: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte(s.TokenURL(token)))
}

func (s *Service) serveHealth(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet && r.Method != http.MethodHead {
		methodNotAllowed(w, "GET")
		return
	}
	if _, err := s.st.Get(r.Context(), s.cfg.Prefix+"health"); err != nil && !errors.Is(err, store.ErrNotFound) {
		http.Error(w, "unhealthy: store: "+err.Error(), http.StatusServiceUnavailable)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = w.Write([]byte("OK"))
}

// snapshot is a token read at one revision.
type snapshot struct {
	rev  int64
	kvs  map[string]store.KeyValue // by rest ("_config/size", "<id>", "_meta")
	meta meta
}

// load reads the token; a missing or expired token is the v2 404.
func (s *Service) load(ctx context.Context, k key) (*snapshot, *Error) {
	kvs, rev, err := s.st.List(ctx, s.tokenPrefix(k.token))
	if err != nil {
		return nil, s.storeError(err, rev)
	}
	snap := &snapshot{rev: rev, kvs: make(map[string]store.KeyValue, len(kvs))}
	for _, kv := range kvs {
		snap.kvs[strings.TrimPrefix(kv.Key, s.tokenPrefix(k.token))] = kv
	}
	mkv, ok := snap.kvs["_meta"]
	if !ok {
		return nil, newError(EcodeKeyNotFound, key{token: k.token}.v2(), rev)
	}
	if snap.meta, ok = decodeMeta(mkv.Value); !ok || s.expired(snap.meta) {
		return nil, newError(EcodeKeyNotFound, key{token: k.token}.v2(), rev)
	}
	return snap, nil
}

// storeError maps a store failure to etcd's 500 "Raft Internal Error",
// which etcd's client retries with backoff.
func (s *Service) storeError(err error, rev int64) *Error {
	if s.ctx.Err() == nil && !errors.Is(err, context.Canceled) {
		s.lg.Error("discovery store request failed", "err", err)
	}
	return newError(EcodeRaftInternal, err.Error(), rev)
}

func leaf(k key, kv store.KeyValue) *Node {
	return &Node{Key: k.v2(), Value: strPtr(string(kv.Value)), ModifiedIndex: kv.ModRevision, CreatedIndex: kv.CreateRevision}
}

// node renders the requested path from the snapshot.
func (snap *snapshot) node(k key) (*Node, bool) {
	switch k.rest {
	case "":
		size := snap.kvs["_config/size"]
		n := &Node{Key: k.v2(), Dir: true, ModifiedIndex: size.CreateRevision, CreatedIndex: size.CreateRevision}
		for rest, kv := range snap.kvs {
			if !hidden(rest) && !strings.Contains(rest, "/") {
				n.Nodes = append(n.Nodes, leaf(key{k.token, rest}, kv))
			}
		}
		sortNodes(n.Nodes)
		return n, true
	case "_config":
		size, ok := snap.kvs["_config/size"]
		if !ok {
			return nil, false
		}
		return &Node{Key: k.v2(), Dir: true, ModifiedIndex: size.CreateRevision, CreatedIndex: size.CreateRevision,
			Nodes: []*Node{leaf(key{k.token, "_config/size"}, size)}}, true
	case "_meta":
		return nil, false
	}
	kv, ok := snap.kvs[k.rest]
	if !ok {
		return nil, false
	}
	return leaf(k, kv), true
}

func sortNodes(ns []*Node) {
	for i := 1; i < len(ns); i++ {
		for j := i; j > 0 && ns[j].Key < ns[j-1].Key; j-- {
			ns[j], ns[j-1] = ns[j-1], ns[j]
		}
	}
}

func (s *Service) serveGet(w http.ResponseWriter, r *http.Request, k key, kr keyRequest) {
	snap, verr := s.load(r.Context(), k)
	if verr != nil {
		verr.write(w)
		return
	}
	if kr.wait {
		s.serveWait(w, r, k, kr, snap)
		return
	}
	n, ok := snap.node(k)
	if !ok {
		newError(EcodeKeyNotFound, k.v2(), snap.rev).write(w)
		return
	}
	writeEvent(w, http.StatusOK, snap.rev, &Event{Action: "get", Node: n})
}

// serveWait answers a long poll: the first change at or after waitIndex
// (the next one when waitIndex is 0) to the key, or with recursive=true to
// any visible key under it. v2 indexes are store revisions, so the
// X-Etcd-Index of a listing + 1 continues it exactly and createdIndex of a
// write finds that write again.
func (s *Service) serveWait(w http.ResponseWriter, r *http.Request, k key, kr keyRequest, snap *snapshot) {
	from := kr.waitIndex
	if from == 0 {
		from = snap.rev + 1
	}
	ctx, cancel := context.WithTimeout(r.Context(), s.cfg.WaitTimeout)
	defer cancel()
	stop := context.AfterFunc(s.ctx, cancel)
	defer stop()
	prefix := s.tokenPrefix(k.token)
	metaKey := s.metaKey(k.token)
	target := s.storeKey(k)
	for resp := range s.st.Watch(ctx, prefix, from) {
		if err := resp.Err; err != nil {
			var ce *store.CompactedError
			if errors.As(err, &ce) {
				newError(EcodeEventIndexCleared,
					fmt.Sprintf("the requested history has been cleared [%d/%d]", ce.CompactRevision, from), snap.rev).write(w)
				return
			}
			s.storeError(err, snap.rev).write(w)
			return
		}
		for _, ev := range resp.Events {
			if ev.KV.Key == metaKey && ev.Type == store.EventDelete {
				// The token was removed or collected.
				newError(EcodeKeyNotFound, key{token: k.token}.v2(), ev.Revision()).write(w)
				return
			}
			if !matches(ev.KV.Key, target, prefix, kr.recursive) {
				continue
			}
			writeEvent(w, http.StatusOK, snap.rev, s.event(k.token, ev))
			return
		}
	}
	if r.Context().Err() != nil {
		return // the client went away
	}
	if s.ctx.Err() != nil {
		// etcd's error body for a server that cannot serve; clients
		// retry a 503.
		newError(EcodeRaftInternal, "discovery service is shutting down", 0).writeStatus(w, http.StatusServiceUnavailable)
		return
	}
	// Timeout: 200 with an empty body, which etcd's client answers by
	// polling again with the same index.
	w.Header().Set("X-Etcd-Index", strconv.FormatInt(snap.rev, 10))
	w.WriteHeader(http.StatusOK)
}

// matches reports whether a change to key (a store key under the token's
// prefix) answers a wait on target: the key itself, or with recursive a
// visible key below it (a key is hidden when an element of its path below
// the target starts with '_', as in etcd v2).
func matches(storeKey, target, prefix string, recursive bool) bool {
	if storeKey == target {
		return true
	}
	if !recursive {
		return false
	}
	dir := target
	if dir != prefix {
		dir += "/"
	}
	below, ok := strings.CutPrefix(storeKey, dir)
	if !ok {
		return false
	}
	for _, elem := range strings.Split(below, "/") {
		if hidden(elem) {
			return false
		}
	}
	return true
}

func (s *Service) event(token string, ev store.Event) *Event {
	k := key{token: token, rest: strings.TrimPrefix(ev.KV.Key, s.tokenPrefix(token))}
	if ev.Type == store.EventDelete {
		return &Event{Action: "delete", Node: &Node{Key: k.v2(), ModifiedIndex: ev.KV.ModRevision}}
	}
	action := "set"
	if ev.KV.CreateRevision == ev.KV.ModRevision {
		action = "create"
	}
	return &Event{Action: action, Node: leaf(k, ev.KV)}
}

func (s *Service) servePut(w http.ResponseWriter, r *http.Request, k key, kr keyRequest) {
	if hidden(k.rest) || strings.HasPrefix(k.rest, "_config/") {
		newError(EcodeKeyIsPreserved, k.v2(), 0).write(w)
		return
	}
	if !validMember(k.rest) {
		newError(EcodeInvalidField, fmt.Sprintf("only %s/<member-id> keys can be written (member IDs are 1 to 64 of [A-Za-z0-9._-])",
			key{token: k.token}.v2()), 0).write(w)
		return
	}
	value := r.Form.Get("value")
	if len(value) > maxValue {
		newError(EcodeInvalidField, fmt.Sprintf("value of %d bytes is longer than the %d-byte limit", len(value), maxValue), 0).write(w)
		return
	}
	ctx := r.Context()
	for range casAttempts {
		snap, verr := s.load(ctx, k)
		if verr != nil {
			verr.write(w)
			return
		}
		prev, exists := snap.kvs[k.rest]
		switch {
		case exists && kr.prevExist != nil && !*kr.prevExist:
			newError(EcodeNodeExist, k.v2(), snap.rev).write(w)
			return
		case !exists && kr.prevExist != nil && *kr.prevExist:
			newError(EcodeKeyNotFound, k.v2(), snap.rev).write(w)
			return
		case !exists && s.members(snap) >= s.cfg.MaxMembers:
			newError(EcodeNoMorePeer, fmt.Sprintf("token %s already has %d registrations", k.token, s.cfg.MaxMembers), snap.rev).write(w)
			return
		}
		var rev int64
		var err error
		if exists {
			rev, err = s.st.Update(ctx, s.storeKey(k), []byte(value), prev.ModRevision)
		} else {
			rev, err = s.st.Create(ctx, s.storeKey(k), []byte(value))
		}
		switch {
		case errors.Is(err, store.ErrKeyExists) && kr.prevExist != nil:
			newError(EcodeNodeExist, k.v2(), snap.rev).write(w)
			return
		case errors.Is(err, store.ErrKeyExists), errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue // raced with another write: read again
		case err != nil:
			s.storeError(err, snap.rev).write(w)
			return
		}
		node := &Node{Key: k.v2(), Value: strPtr(value), ModifiedIndex: rev, CreatedIndex: rev}
		ev := &Event{Action: "set", Node: node}
		status := http.StatusCreated
		if exists {
			node.CreatedIndex = prev.CreateRevision
			ev.PrevNode = leaf(k, prev)
			status = http.StatusOK
		}
		switch {
		case kr.prevExist != nil && !*kr.prevExist:
			ev.Action = "create"
		case kr.prevExist != nil:
			ev.Action = "update"
		}
		writeEvent(w, status, rev, ev)
		return
	}
	s.storeError(errors.New("too many concurrent writes to the key; try again"), 0).write(w)
}

func (s *Service) members(snap *snapshot) int {
	n := 0
	for rest := range snap.kvs {
		if !hidden(rest) {
			n++
		}
	}
	return n
}

func (s *Service) serveDelete(w http.ResponseWriter, r *http.Request, k key, kr keyRequest) {
	ctx := r.Context()
	switch {
	case k.rest == "":
		if !kr.recursive {
			newError(EcodeNotFile, k.v2(), 0).write(w)
			return
		}
		snap, verr := s.load(ctx, k)
		if verr != nil {
			verr.write(w)
			return
		}
		kvs := make([]store.KeyValue, 0, len(snap.kvs))
		for _, kv := range snap.kvs {
			kvs = append(kvs, kv)
		}
		if err := s.deleteToken(ctx, k.token, kvs); err != nil {
			s.storeError(err, snap.rev).write(w)
			return
		}
		s.lg.Info("discovery token removed", "token", k.token)
		n, _ := snap.node(k)
		prev := *n
		prev.Nodes = nil
		writeEvent(w, http.StatusOK, snap.rev, &Event{Action: "delete",
			Node: &Node{Key: k.v2(), Dir: true, CreatedIndex: n.CreatedIndex}, PrevNode: &prev})
		return
	case hidden(k.rest) || strings.HasPrefix(k.rest, "_config/"):
		newError(EcodeKeyIsPreserved, k.v2(), 0).write(w)
		return
	}
	for range casAttempts {
		snap, verr := s.load(ctx, k)
		if verr != nil {
			verr.write(w)
			return
		}
		prev, ok := snap.kvs[k.rest]
		if !ok {
			newError(EcodeKeyNotFound, k.v2(), snap.rev).write(w)
			return
		}
		rev, err := s.st.Delete(ctx, s.storeKey(k), store.IfModRevision(prev.ModRevision))
		switch {
		case errors.Is(err, store.ErrConflict), errors.Is(err, store.ErrNotFound):
			continue
		case err != nil:
			s.storeError(err, snap.rev).write(w)
			return
		}
		writeEvent(w, http.StatusOK, rev, &Event{Action: "delete",
			Node: &Node{Key: k.v2(), ModifiedIndex: rev, CreatedIndex: prev.CreateRevision}, PrevNode: leaf(k, prev)})
		return
	}
	s.storeError(errors.New("too many concurrent writes to the key; try again"), 0).write(w)
}
