// Package registryapi is the HTTP API of Beacon's service registry, served by
// `beacon serve` for clients that do not speak Go: register an instance
// with a TTL, heartbeat, update, deregister, list with filters, and watch as
// Server-Sent Events resumable with Last-Event-ID.
//
// Every HTTP registration gets its own lease: the instance disappears when
// its client stops heartbeating for one TTL, exactly like a Go worker's.
// Errors are JSON bodies {"code": "...", "message": "..."}; the server
// serves the OpenAPI document of the whole API at /v1/openapi.json. docs/registry.md describes the
// API with examples.
package registryapi

import (
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

// Options configure the API. The zero value is usable.
type Options struct {
	// Logger receives one line per registration and deregistration and
	// every internal error; nil discards.
	Logger *slog.Logger
	// Metrics registers the API's collectors; nil means none.
	Metrics prometheus.Registerer
	// KeepAliveInterval is how often an idle watch stream sends an SSE
	// comment so that proxies keep it open; 15 s when zero.
	KeepAliveInterval time.Duration
}

// Handler serves the API. Create it with New.
type Handler struct {
	reg       registry.Discoverer
	leased    registry.LeasedRegistrar // nil: the registry cannot register over HTTP
	log       *slog.Logger
	mux       *httpapi.Mux
	keepAlive time.Duration
	m         *metrics
}

// New returns the API over reg. Lists, gets and watches work over any
// registry; registration over HTTP needs the registry.LeasedRegistrar
// capability (every store-backed registry has it) and is otherwise refused
// with 501 and the code not_implemented.
func New(reg registry.Discoverer, opts Options) (*Handler, error) {
	if reg == nil {
		return nil, errors.New("registryapi: nil registry")
	}
	if opts.Logger == nil {
		opts.Logger = slog.New(slog.DiscardHandler)
	}
	if opts.KeepAliveInterval == 0 {
		opts.KeepAliveInterval = 15 * time.Second
	}
	m, err := newMetrics(opts.Metrics)
	if err != nil {
		return nil, err
	}
	leased, _ := reg.(registry.LeasedRegistrar)
	h := &Handler{reg: reg, leased: leased, log: opts.Logger.With("component", "registry-api"), keepAlive: opts.KeepAliveInterval, m: m}
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
	h.handle(r, "POST "+InstancesPath, h.needLeases(h.register))
	h.handle(r, "GET "+InstancesPath, h.list)
	h.handle(r, "GET "+one, h.get)
	h.handle(r, "PATCH "+one, h.needLeases(h.update))
	h.handle(r, "DELETE "+one, h.needLeases(h.deregister))
	h.handle(r, "POST "+one+"/heartbeat", h.needLeases(h.heartbeat))
	h.handle(r, "GET "+WatchPath, h.watch)
}

// Routes lists the path prefixes the handler serves, for mounting it as a
// whole; Register is the finer way.
func Routes() []string {
	return []string{InstancesPath, InstancesPath + "/", WatchPath}
}

func (h *Handler) ServeHTTP(w http.ResponseWriter, r *http.Request) { h.mux.ServeHTTP(w, r) }

// needLeases refuses a write when the registry cannot bind registrations
// to leases of their own.
func (h *Handler) needLeases(fn http.HandlerFunc) http.HandlerFunc {
	if h.leased != nil {
		return fn
	}
	return func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotImplemented, "not_implemented",
			"this server's registry backend cannot register instances over HTTP (it has no leases); "+
				"register with the Go library or `beacon register` on the backend itself")
	}
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
}

// RegisterResponse is the answer to a registration.
type RegisterResponse struct {
	Instance beacon.Instance `json:"instance"`
	// Lease is the lease ID, in hex, to present on heartbeat, update and
	// deregister.
	Lease string `json:"lease"`
	// TTLSeconds is the granted TTL: heartbeat well within it (every
	// third of it is the usual cadence).
	TTLSeconds float64 `json:"ttl_seconds"`
}

// LeaseRequest is the body of a heartbeat.
type LeaseRequest struct {
	Lease string `json:"lease"`
}

// HeartbeatResponse is the answer to a heartbeat.
type HeartbeatResponse struct {
	TTLSeconds float64 `json:"ttl_seconds"`
}

// UpdateRequest is the body of PATCH on an instance: the fields to change.
type UpdateRequest struct {
	Lease     string             `json:"lease"`
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

// UnmarshalJSON accepts a duration string or a number of seconds.
func (t *TTL) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err == nil {
		d, err := registry.ParseTTL(s)
		if err != nil {
			return fmt.Errorf("ttl: %w", err)
		}
		*t = TTL(d)
		return nil
	}
	var n float64
	if err := json.Unmarshal(b, &n); err != nil {
		return fmt.Errorf(`ttl: %w: want a duration like "15s" or a number of seconds`, registry.ErrInvalidTTL)
	}
	d := time.Duration(n * float64(time.Second))
	if err := registry.ValidateTTL(d); err != nil {
		return fmt.Errorf("ttl: %w", err)
	}
	*t = TTL(d)
	return nil
}

func (h *Handler) register(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
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
	out, lease, err := h.leased.RegisterWithTTL(r.Context(), in, ttl)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	h.log.Info("registered", "instance", out.Ref().String(), "address", out.Address, "lease", formatLease(lease.ID), "ttl", lease.TTL)
	writeJSON(w, http.StatusCreated, RegisterResponse{Instance: out, Lease: formatLease(lease.ID), TTLSeconds: lease.TTL.Seconds()})
}

func (h *Handler) heartbeat(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return
	}
	var req LeaseRequest
	if !decode(w, r, &req) {
		return
	}
	lease, ok := parseLease(w, req.Lease)
	if !ok {
		return
	}
	ttl, err := h.leased.Heartbeat(r.Context(), ref, lease)
	if err != nil {
		h.fail(w, r, err)
		return
	}
	writeJSON(w, http.StatusOK, HeartbeatResponse{TTLSeconds: ttl.Seconds()})
}

func (h *Handler) update(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return
	}
	var req UpdateRequest
	if !decode(w, r, &req) {
		return
	}
	lease, ok := parseLease(w, req.Lease)
	if !ok {
		return
	}
	out, err := h.leased.UpdateLeased(r.Context(), ref, lease, func(in *beacon.Instance) {
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
	writeJSON(w, http.StatusOK, out)
}

func (h *Handler) deregister(w http.ResponseWriter, r *http.Request) {
	params, ok := httpapi.CheckQuery(w, r, "lease")
	if !ok {
		return
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return
	}
	lease, ok := parseLease(w, params["lease"])
	if !ok {
		return
	}
	if err := h.leased.DeregisterLeased(r.Context(), ref, lease); err != nil {
		h.fail(w, r, err)
		return
	}
	// The lease was this client's alone: end it too.
	if err := h.leased.RevokeLease(r.Context(), lease); err != nil && !errors.Is(err, beacon.ErrNotFound) {
		h.log.Warn("revoking the lease of a deregistered instance failed; it expires by itself", "lease", formatLease(lease), "err", err)
	}
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
	in, err := registry.Get(r.Context(), h.reg, ref)
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
	ins, rev, err := h.reg.List(r.Context(), q)
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

// ParseLease parses a lease ID as the API renders it (hex).
func ParseLease(s string) (store.LeaseID, error) {
	n, err := strconv.ParseUint(strings.TrimPrefix(s, "0x"), 16, 64)
	if err != nil || n == 0 {
		return 0, fmt.Errorf("lease %q: want the hex lease ID returned at registration", s)
	}
	return store.LeaseID(n), nil
}

func parseLease(w http.ResponseWriter, s string) (store.LeaseID, bool) {
	if s == "" {
		writeError(w, http.StatusBadRequest, "invalid_argument", "lease is required: the hex lease ID returned at registration")
		return 0, false
	}
	id, err := ParseLease(s)
	if err != nil {
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
		return 0, false
	}
	return id, true
}

// decode reads a JSON body strictly: a JSON Content-Type (or none),
// bounded, one object, no unknown fields, not empty.
func decode(w http.ResponseWriter, r *http.Request, v any) bool {
	return httpapi.DecodeJSON(w, r, v, maxBody, registry.ErrInvalidTTL)
}

// ErrorResponse is the body of every error: {"code","message"}, the code
// one of invalid_argument, not_found, already_registered, lease_mismatch,
// method_not_allowed, not_implemented, unavailable or internal.
type ErrorResponse = httpapi.Error

// fail maps a registry error to a status and code.
func (h *Handler) fail(w http.ResponseWriter, r *http.Request, err error) {
	switch {
	case errors.Is(err, beacon.ErrInvalid), errors.Is(err, registry.ErrInvalidTTL), errors.Is(err, registry.ErrIdentityChanged):
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	case errors.Is(err, beacon.ErrAlreadyRegistered):
		writeError(w, http.StatusConflict, "already_registered", err.Error())
	case errors.Is(err, registry.ErrLeaseMismatch):
		writeError(w, http.StatusConflict, "lease_mismatch", err.Error())
	case errors.Is(err, beacon.ErrNotFound), errors.Is(err, store.ErrNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, store.ErrUnavailable), errors.Is(err, registry.ErrClosed), errors.Is(err, store.ErrClosed):
		writeError(w, http.StatusServiceUnavailable, "unavailable", err.Error())
	case r.Context().Err() != nil:
		writeError(w, http.StatusServiceUnavailable, "unavailable", "request ended: "+err.Error())
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
