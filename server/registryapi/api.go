// Package registryapi is the HTTP API of Beacon's service registry, served by
// `beacon serve` for clients that do not speak Go: register an instance
// with a TTL (and the health check to run on it), heartbeat, report a TTL
// check, update, deregister, list with filters, and watch as Server-Sent
// Events resumable with Last-Event-ID; and, for an operator
// authenticated as an etcd user, drain or deregister any instance of a
// namespace that user may write (operator.go).
//
// Every HTTP registration gets its own lease: the instance disappears when
// its client stops heartbeating for one TTL, exactly like a Go worker's. It
// also gets a secret, returned once, that heartbeat, update and deregister
// require in the Beacon-Secret header; a wrong or missing secret gets the
// answer an unknown instance gets. Errors are JSON bodies {"code": "...", "message": "..."}; the server
// serves the OpenAPI document of the whole API at /v1/openapi.json. docs/registry.md describes the
// API with examples.
package registryapi

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/internal/setting"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
	"github.com/prometheus/client_golang/prometheus"
)

// Paths of the API.
const (
	InstancesPath = "/v1/registry/instances"
	WatchPath     = "/v1/registry/watch"
)

// maxBody bounds request bodies: an instance with the largest metadata
// fits many times over.
const maxBody = 64 << 10

// SecretHeader carries a registration's secret on heartbeat, update and
// deregister.
const SecretHeader = "Beacon-Secret"

// Config configures the API. The zero value is usable.
type Config struct {
	// Registry, when set, chooses the registry of each request (for
	// example a view acting as the request's authenticated etcd user);
	// the registry given to New is then only a default for requests it
	// returns nil for. Its errors are answered like the registry's (a
	// store.ErrUnauthenticated 401, a store.ErrPermissionDenied 403).
	Registry func(*http.Request) (registry.Discoverer, error)
	// Operators, when set, returns the registry through which a request
	// may act as an operator (drain or deregister an instance another
	// client registered), and the operator's name for the logs: a view
	// acting as the request's authenticated etcd user, whose roles etcd
	// enforces. A nil registry (no authenticated user) refuses operator
	// actions with 403; so does a nil Operators. The registry given to New
	// is never used for them.
	Operators func(*http.Request) (registry.Discoverer, string)
	// Limits bound the watch streams and registrations of each client
	// and of all of them; see Limits for the zero value.
	Limits Limits
	// Logger receives one line per registration and deregistration and
	// every internal error; nil discards.
	Logger *slog.Logger
	// Metrics registers the API's collectors; nil means none.
	Metrics prometheus.Registerer
	// SettingName names a setting in what the server says while it runs
	// (answers, logs): it is given a field ("registryapi.Config.Operators") and returns
	// what an operator changes (beacon serve: the flag). Nil, or "", names
	// the field.
	SettingName func(field string) string
	// KeepAliveInterval is how often an idle watch stream sends an SSE
	// comment so that proxies keep it open; 15 s when zero.
	KeepAliveInterval time.Duration
}

// Handler serves the API. Create it with New.
type Handler struct {
	reg       registry.Discoverer
	pick      func(*http.Request) (registry.Discoverer, error) // nil: reg for every request
	operators func(*http.Request) (registry.Discoverer, string)
	setting   setting.Namer // names the settings its answers suggest
	log       *slog.Logger
	mux       *httpapi.Mux
	keepAlive time.Duration
	// writeTimeout is how long one write of a watch stream may wait beyond
	// a keep-alive interval (streamWriteTimeout; shorter in tests).
	writeTimeout time.Duration
	m            *metrics
	quota        *quota
}

// New returns the API over reg. Lists, gets and watches work over any
// registry; registration over HTTP needs the registry.LeasedRegistrar
// capability (every store-backed registry has it) and is otherwise refused
// with 501 and the code not_implemented.
func New(reg registry.Discoverer, cfg Config) (*Handler, error) {
	if reg == nil {
		return nil, errors.New("registryapi: nil registry")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	if cfg.KeepAliveInterval == 0 {
		cfg.KeepAliveInterval = 15 * time.Second
	}
	m, err := newMetrics(cfg.Metrics)
	if err != nil {
		return nil, err
	}
	q, err := newQuota(cfg.Limits)
	if err != nil {
		return nil, err
	}
	h := &Handler{reg: reg, pick: cfg.Registry, operators: cfg.Operators, setting: setting.Namer(cfg.SettingName), log: cfg.Logger.With("component", "registry-api"),
		keepAlive: cfg.KeepAliveInterval, writeTimeout: streamWriteTimeout, m: m, quota: q}
	h.mux = httpapi.NewMux()
	h.mux.NotFound = "see /v1/openapi.json"
	h.Register(h.mux)
	return h, nil
}

// Router is where Register adds the API's routes: an *http.ServeMux, or
// the server's router.
type Router interface {
	Handle(pattern string, h http.Handler)
}

// Register adds every route of the API to r, with its method, so that the
// router knows exactly what is served (ServeHTTP serves the same routes
// through a router of its own).
func (h *Handler) Register(r Router) {
	one := InstancesPath + "/{namespace}/{component}/{endpoint}/{id}"
	h.handle(r, "POST "+InstancesPath, h.register)
	h.handle(r, "GET "+InstancesPath, h.list)
	h.handle(r, "GET "+one, h.get)
	h.handle(r, "PATCH "+one, h.update)
	h.handle(r, "DELETE "+one, h.deregister)
	h.handle(r, "POST "+one+"/heartbeat", h.heartbeat)
	h.handle(r, "POST "+one+"/report", h.report)
	h.handle(r, "POST "+one+"/drain", h.operatorDrain)           // operator.go
	h.handle(r, "POST "+one+"/deregister", h.operatorDeregister) // operator.go
	h.handle(r, "GET "+WatchPath, h.watch)
}

// Routes lists the path prefixes the handler serves, for mounting it as a
// whole; Register is the finer way.
func Routes() []string {
	return []string{InstancesPath, InstancesPath + "/", WatchPath}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// discoverer returns the registry of the request, or answers the error.
func (h *Handler) discoverer(w http.ResponseWriter, r *http.Request) (registry.Discoverer, bool) {
	if h.pick == nil {
		return h.reg, true
	}
	d, err := h.pick(r)
	if err != nil {
		h.fail(w, r, err)
		return nil, false
	}
	if d == nil {
		d = h.reg
	}
	return d, true
}

// leasedFor returns the registry of the request as a LeasedRegistrar, or
// answers 501 when it cannot bind registrations to leases of their own.
func (h *Handler) leasedFor(w http.ResponseWriter, r *http.Request) (registry.LeasedRegistrar, bool) {
	d, ok := h.discoverer(w, r)
	if !ok {
		return nil, false
	}
	l, ok := d.(registry.LeasedRegistrar)
	if !ok {
		writeError(w, http.StatusNotImplemented, "not_implemented",
			"this server's registry backend cannot register instances over HTTP (it has no leases); "+
				"register with the Go library or `beacon register` on the backend itself")
		return nil, false
	}
	return l, true
}

// handle registers fn under pattern, counting requests by route and code.
func (h *Handler) handle(mux Router, pattern string, fn http.HandlerFunc) {
	mux.Handle(pattern, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := &statusRecorder{ResponseWriter: w, code: http.StatusOK}
		fn(rec, r)
		h.m.request(pattern, rec.code)
	}))
}

// RegisterRequest is the body of POST /v1/registry/instances.
type RegisterRequest struct {
	Namespace string            `json:"namespace"`
	Component string            `json:"component"`
	Endpoint  string            `json:"endpoint"`
	ID        string            `json:"id,omitempty"`
	Address   string            `json:"address"`
	Transport string            `json:"transport,omitempty"`
	Metadata  map[string]string `json:"metadata,omitempty"`
	// TTL is the lease TTL: a duration string ("15s") or a number of
	// seconds; 10 s when absent. It must be within [1 s, 1 h].
	TTL TTL `json:"ttl,omitempty"`
	// Check, when set, is the health check Beacon's checkers run on the
	// instance (beacon.Check's JSON, durations as strings: "10s").
	Check *Check `json:"check,omitempty"`
}

// RegisterResponse is the answer to a registration.
type RegisterResponse struct {
	Instance beacon.Instance `json:"instance"`
	// Secret proves the ownership of the registration: send it in the
	// Beacon-Secret header on heartbeat, update and deregister. It is
	// shown only here; the server keeps only its hash.
	Secret string `json:"secret"`
	// Lease is the registration's own lease ID, in hex, for reference
	// (etcdctl lease timetolive). It is not a credential.
	Lease string `json:"lease"`
	// TTLSeconds is the granted TTL: heartbeat well within it (every
	// third of it is the usual cadence).
	TTLSeconds float64 `json:"ttl_seconds"`
	// Warning, when set, says what was registered but will not work as
	// meant: a TTL below the shortest that rides out an etcd leader
	// election (registry.TTLWarning), routing metadata DNS and xDS
	// cannot read (Instance.RoutingWarnings); several are joined by "; ".
	Warning string `json:"warning,omitempty"`
}

// HeartbeatRequest is the optional body of a heartbeat. It carries
// nothing: the secret goes in the Beacon-Secret header.
type HeartbeatRequest struct {
	// Lease is refused: a lease ID is not proof of ownership.
	Lease string `json:"lease,omitempty"`
}

// HeartbeatResponse is the answer to a heartbeat.
type HeartbeatResponse struct {
	TTLSeconds float64 `json:"ttl_seconds"`
}

// UpdateRequest is the body of PATCH on an instance: the fields to change.
// The secret goes in the Beacon-Secret header.
type UpdateRequest struct {
	// Lease is refused: a lease ID is not proof of ownership.
	Lease     string             `json:"lease,omitempty"`
	Address   *string            `json:"address,omitempty"`
	Transport *string            `json:"transport,omitempty"`
	Metadata  *map[string]string `json:"metadata,omitempty"`
	Status    *beacon.Status     `json:"status,omitempty"`
}

// ListResponse is the answer to GET /v1/registry/instances.
type ListResponse struct {
	Revision  int64             `json:"revision"`
	Instances []beacon.Instance `json:"instances"`
}

// TTL is a lease TTL in JSON: "15s" or 15.
type TTL time.Duration

// UnmarshalJSON accepts a duration string or a number of seconds; null is
// refused (json.Unmarshal would read it as "").
func (t *TTL) UnmarshalJSON(b []byte) error {
	if string(b) == "null" {
		return fmt.Errorf(`%w: "ttl" is null: null is not a value here: give one, or leave the field out for the default`, registry.ErrInvalidTTL)
	}
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		d, err := registry.ParseTTL(s)
		if err != nil {
			return fmt.Errorf("ttl: %w", err)
		}
		*t = TTL(d)
		return nil
	}
	var num json.Number
	if err := json.Unmarshal(b, &num); err != nil {
		return fmt.Errorf(`ttl: %w: want a duration like "15s" or a number of seconds`, registry.ErrInvalidTTL)
	}
	d, err := registry.ParseTTLSeconds(num.String())
	if err != nil {
		return fmt.Errorf("ttl: %w", err)
	}
	*t = TTL(d)
	return nil
}

func (h *Handler) register(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	leased, ok := h.leasedFor(w, r)
	if !ok {
		return
	}
	var req RegisterRequest
	if !decode(w, r, &req) {
		return
	}
	ttl := time.Duration(req.TTL)
	if ttl == 0 {
		ttl = registry.DefaultLeaseTTL
	}
	in := beacon.Instance{
		Namespace: req.Namespace, Component: req.Component, Endpoint: req.Endpoint, ID: req.ID,
		Address: req.Address, Transport: req.Transport, Metadata: req.Metadata,
	}
	if req.Check != nil {
		c := beacon.Check(*req.Check)
		if err := c.Validate(); err != nil {
			writeError(w, http.StatusBadRequest, "invalid_argument", "check: "+err.Error())
			return
		}
		in.Check = &c
	}
	client := h.quota.client(r)
	slot, ok := h.quota.reserveRegistration(w, client)
	if !ok {
		return
	}
	o, err := leased.RegisterWithTTL(r.Context(), in, ttl)
	if err != nil {
		slot.cancel()
		h.fail(w, withNamespace(r, in.Namespace), err)
		return
	}
	slot.commit(o.Instance.Ref(), o.Lease.TTL)
	h.log.Info("registered", "instance", o.Instance.Ref().String(), "address", o.Instance.Address, "ttl", o.Lease.TTL, "client", client)
	warnings := o.Instance.RoutingWarnings()
	if w := registry.TTLWarning(o.Lease.TTL); w != "" {
		h.log.Warn("registration TTL below the shortest that rides out an etcd leader election", "instance", o.Instance.Ref().String(),
			"ttl", o.Lease.TTL, "client", client, "warning", w)
		warnings = append([]string{w}, warnings...)
	}
	warning := strings.Join(warnings, "; ")
	// The answer carries the registration's secret: no cache may keep it
	// (as POST /v1/auth/token's token).
	w.Header().Set("Cache-Control", "no-store")
	writeJSON(w, http.StatusCreated, RegisterResponse{Instance: o.Instance, Secret: string(o.Secret),
		Lease: formatLease(o.Lease.ID), TTLSeconds: o.Lease.TTL.Seconds(), Warning: warning})
}

// secret reads the Beacon-Secret header. A missing one is not an error
// here: it fails like a wrong one.
func secret(r *http.Request) registry.Secret {
	return registry.Secret(strings.TrimSpace(r.Header.Get(SecretHeader)))
}

// refuseLease answers 400 when a request still presents a lease ID as its
// credential.
func refuseLease(w http.ResponseWriter, lease string) bool {
	if lease == "" {
		return false
	}
	writeError(w, http.StatusBadRequest, "invalid_argument",
		"a lease ID is not proof of ownership: send the secret returned at registration in the "+SecretHeader+" header, and no lease")
	return true
}

// ownerRequest checks what a request of the registering client on one
// instance takes (heartbeat, update): no query, a registry that takes
// leased registrations, a valid instance path.
func (h *Handler) ownerRequest(w http.ResponseWriter, r *http.Request) (registry.LeasedRegistrar, beacon.Ref, bool) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return nil, beacon.Ref{}, false
	}
	leased, ok := h.leasedFor(w, r)
	if !ok {
		return nil, beacon.Ref{}, false
	}
	ref, ok := pathRef(w, r)
	return leased, ref, ok
}

func (h *Handler) heartbeat(w http.ResponseWriter, r *http.Request) {
	leased, ref, ok := h.ownerRequest(w, r)
	if !ok {
		return
	}
	var req HeartbeatRequest
	if r.ContentLength != 0 && !decode(w, r, &req) {
		return
	}
	if refuseLease(w, req.Lease) {
		return
	}
	ttl, err := leased.Heartbeat(r.Context(), ref, secret(r))
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.quota.renewRegistration(ref, ttl)
	writeJSON(w, http.StatusOK, HeartbeatResponse{TTLSeconds: ttl.Seconds()})
}

func (h *Handler) update(w http.ResponseWriter, r *http.Request) {
	leased, ref, ok := h.ownerRequest(w, r)
	if !ok {
		return
	}
	var req UpdateRequest
	if !decode(w, r, &req) {
		return
	}
	if refuseLease(w, req.Lease) {
		return
	}
	out, err := leased.UpdateLeased(r.Context(), ref, secret(r), func(in *beacon.Instance) {
		if req.Address != nil {
			in.Address = *req.Address
		}
		if req.Transport != nil {
			in.Transport = *req.Transport
		}
		if req.Metadata != nil {
			in.Metadata = *req.Metadata
		}
		if req.Status != nil {
			in.Status = *req.Status
		}
	})
	if err != nil {
		h.fail(w, r, err)
		return
	}
	// The answer is the instance, as stored: its warnings go in Warning
	// headers, as Kubernetes' API server sends them (kubectl prints them).
	for _, warning := range out.RoutingWarnings() {
		w.Header().Add("Warning", `299 - "`+strings.ReplaceAll(warning, `"`, `'`)+`"`)
	}
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deregister(w http.ResponseWriter, r *http.Request) {
	params, ok := httpapi.CheckQuery(w, r, "lease")
	if !ok {
		return
	}
	if refuseLease(w, params["lease"]) {
		return
	}
	leased, ok := h.leasedFor(w, r)
	if !ok {
		return
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return
	}
	// The registration's own lease is revoked: the instance and its
	// ownership record go together.
	if err := leased.DeregisterLeased(r.Context(), ref, secret(r)); err != nil {
		h.fail(w, r, err)
		return
	}
	h.quota.releaseRegistration(ref)
	h.log.Info("deregistered", "instance", ref.String())
	w.WriteHeader(http.StatusNoContent)
}

func (h *Handler) get(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return
	}
	reg, ok := h.discoverer(w, r)
	if !ok {
		return
	}
	in, err := registry.Get(r.Context(), reg, ref)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, in)
}

func (h *Handler) list(w http.ResponseWriter, r *http.Request) {
	params, ok := httpapi.CheckQuery(w, r, "namespace", "component", "endpoint", "status")
	if !ok {
		return
	}
	q, ok := query(w, params)
	if !ok {
		return
	}
	status := params["status"]
	if status != "" && status != string(beacon.StatusServing) && status != string(beacon.StatusDraining) {
		writeError(w, http.StatusBadRequest, "invalid_argument", fmt.Sprintf("status %q: must be serving or draining", status))
		return
	}
	reg, ok := h.discoverer(w, r)
	if !ok {
		return
	}
	ins, rev, err := reg.List(r.Context(), q)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	if status != "" {
		kept := ins[:0]
		for _, in := range ins {
			if string(in.Status) == status {
				kept = append(kept, in)
			}
		}
		ins = kept
	}
	if ins == nil {
		ins = []beacon.Instance{}
	}
	writeJSON(w, http.StatusOK, ListResponse{Revision: rev, Instances: ins})
}

// query reads the namespace/component/endpoint filters of checked query
// parameters.
func query(w http.ResponseWriter, v map[string]string) (beacon.Query, bool) {
	q := beacon.Query{Namespace: v["namespace"], Component: v["component"], Endpoint: v["endpoint"]}
	if err := q.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return beacon.Query{}, false
	}
	return q, true
}

func pathRef(w http.ResponseWriter, r *http.Request) (beacon.Ref, bool) {
	ref := beacon.Ref{
		Namespace: r.PathValue("namespace"), Component: r.PathValue("component"),
		Endpoint: r.PathValue("endpoint"), ID: r.PathValue("id"),
	}
	if err := ref.Validate(); err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return beacon.Ref{}, false
	}
	return ref, true
}

func formatLease(id store.LeaseID) string { return strconv.FormatUint(uint64(id), 16) }

// decode reads a JSON body strictly: a JSON Content-Type (or none),
// bounded, one object, no unknown fields, not empty.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return httpapi.DecodeJSON(w, r, v, maxBody, registry.ErrInvalidTTL, beacon.ErrInvalidCheck)
}

// ErrorResponse is the body of every error: {"code","message"}, the code
// one of invalid_argument, unauthenticated, permission_denied, not_found,
// already_registered, method_not_allowed, resource_exhausted,
// not_implemented, unavailable or internal.
type ErrorResponse = httpapi.Error

// fail maps a registry error to a status and code.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, beacon.ErrInvalid), errors.Is(err, beacon.ErrInvalidCheck), errors.Is(err, registry.ErrInvalidTTL),
		errors.Is(err, registry.ErrIdentityChanged):
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	case errors.Is(err, beacon.ErrAlreadyRegistered):
		writeError(w, http.StatusConflict, "already_registered", err.Error())
	case errors.Is(err, store.ErrUnauthenticated):
		writeUnauthenticated(w, err)
	case errors.Is(err, store.ErrPermissionDenied):
		writeError(w, http.StatusForbidden, "permission_denied", permissionMessage(r, h.quota.client(r), namespaceOf(r), err))
	case errors.Is(err, beacon.ErrNotFound), errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, registry.ErrClosed), errors.Is(err, store.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	case errors.Is(err, registry.ErrReadOnlyLayout): // --layout dynamo: the message says why and what to do
		writeError(w, http.StatusNotImplemented, "not_implemented", err.Error())
	case r.Context().Err() != nil:
		writeError(w, http.StatusServiceUnavailable, "unavailable", fmt.Sprintf("request ended: %v: %v", context.Cause(r.Context()), err))
	default:
		h.log.Error("request failed", "method", r.Method, "path", r.URL.Path, "err", err)
		writeError(w, http.StatusInternalServerError, "internal", err.Error())
	}
}

func writeError(w http.ResponseWriter, code int, kind, msg string) {
	httpapi.WriteError(w, code, kind, msg)
}

func writeJSON(w http.ResponseWriter, code int, v any) { httpapi.WriteJSON(w, code, v) }

type statusRecorder struct {
	http.ResponseWriter
	code int
}

func (s *statusRecorder) WriteHeader(code int) {
	s.code = code
	s.ResponseWriter.WriteHeader(code)
}

// Flush lets SSE streams flush through the recorder.
func (s *statusRecorder) Flush() {
	if f, ok := s.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Unwrap lets http.ResponseController reach the real writer.
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
