package bootstrap

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"

	"github.com/beaconplane/beacon/internal/httpapi"
	clientv3 "go.etcd.io/etcd/client/v3"
)

// TokenPath is where NewHandler serves the token API; mount the handler at
// both TokenPath and TokenPath + "/".
const TokenPath = "/v1/tokens"

// maxBody bounds request bodies of the token API.
const maxBody = 64 << 10

// CreateTokenRequest is the body of POST /v1/tokens.
type CreateTokenRequest struct {
	// Size is the cluster size; 0 (the field left out) means 3. In the
	// JSON body, a size that is present must be 1 to MaxSize: an explicit
	// 0 is refused like any other bad size.
	Size int `json:"size,omitempty"`
	// Token is the token to create; empty means a fresh NewToken().
	Token string `json:"token,omitempty"`
}

// CreateTokenResponse is the answer to POST /v1/tokens.
type CreateTokenResponse struct {
	Token     string   `json:"token"`
	Size      int      `json:"size"`
	Endpoints []string `json:"endpoints"`
	// Flags are the flags to give every member (etcd 3.6+ or beacon
	// serve), from MemberFlags.
	Flags    string `json:"flags"`
	Revision int64  `json:"revision"`
}

// TokenStatusResponse is the answer to GET /v1/tokens/{token}.
type TokenStatusResponse struct {
	Status
	// Registered is how many of the Size slots are taken.
	Registered int `json:"registered"`
	// InitialCluster is set once the token is full.
	InitialCluster string `json:"initial_cluster,omitempty"`
}

// RemoveTokenResponse is the answer to DELETE /v1/tokens/{token}.
type RemoveTokenResponse struct {
	Token   string `json:"token"`
	Deleted int64  `json:"deleted"`
}

// ErrorResponse is the body of every error of Beacon's HTTP API:
// {"code","message"}, the code one of invalid_argument, not_found,
// already_exists, failed_precondition (a token whose size key is missing
// or bad, or whose registrations do not form a valid cluster),
// method_not_allowed, unavailable, internal.
type ErrorResponse = httpapi.Error

// ListTokensResponse is the answer to GET /v1/tokens.
type ListTokensResponse = TokenList

// TokenAPI is the HTTP API for v3 discovery tokens, served by `beacon
// serve` over the etcd it runs or fronts:
//
//	GET    /v1/tokens          → 200 ListTokensResponse
//	POST   /v1/tokens          {"size":3} or {"size":3,"token":"…"} → 201 CreateTokenResponse
//	GET    /v1/tokens/{token}  → 200 TokenStatusResponse
//	DELETE /v1/tokens/{token}  → 200 RemoveTokenResponse
//
// Errors are JSON ErrorResponse bodies; no route takes query parameters
// (any is a 400). POST needs a JSON object ({} for the defaults): an empty
// body, another Content-Type, unknown fields or trailing data are refused.
type TokenAPI struct {
	h   *tokenHandler
	mux *httpapi.Mux
}

// NewTokenAPI returns the token API over cli. endpoints are the discovery
// service's client URLs that members should use (they appear in the
// answer to POST). logger (nil: discard) receives one line per token
// created or removed and every internal error.
func NewTokenAPI(cli *clientv3.Client, endpoints []string, logger *slog.Logger) *TokenAPI {
	if logger == nil {
		logger = slog.New(slog.DiscardHandler)
	}
	a := &TokenAPI{
		h:   &tokenHandler{cli: cli, endpoints: endpoints, lg: logger.With("component", "bootstrap-tokens")},
		mux: httpapi.NewMux(),
	}
	a.mux.NotFound = fmt.Sprintf("the token API is %s and %s/{token}", TokenPath, TokenPath)
	a.Register(a.mux)
	return a
}

// NewHandler returns the token API as an http.Handler (see TokenAPI);
// mount it at TokenPath and TokenPath + "/", or use NewTokenAPI and
// Register to add its routes to a router.
func NewHandler(cli *clientv3.Client, endpoints []string, logger *slog.Logger) http.Handler {
	return NewTokenAPI(cli, endpoints, logger)
}

// Router is where Register adds the routes: an *http.ServeMux, or a
// server's router.
type Router interface {
	Handle(pattern string, h http.Handler)
}

// Register adds the API's routes, with their methods, to r.
func (a *TokenAPI) Register(r Router) {
	r.Handle("GET "+TokenPath, http.HandlerFunc(a.h.list))
	r.Handle("POST "+TokenPath, http.HandlerFunc(a.h.create))
	r.Handle("GET "+TokenPath+"/{token}", http.HandlerFunc(a.h.status))
	r.Handle("DELETE "+TokenPath+"/{token}", http.HandlerFunc(a.h.remove))
}

// ServeHTTP serves the API's routes; other paths get a JSON 404, other
// methods a JSON 405.
func (a *TokenAPI) ServeHTTP(w http.ResponseWriter, r *http.Request) { a.mux.ServeHTTP(w, r) }

type tokenHandler struct {
	cli       *clientv3.Client
	endpoints []string
	lg        *slog.Logger
}

func (h *tokenHandler) list(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), DefaultRequestTimeout)
	defer cancel()
	list, err := ListTokens(ctx, h.cli)
	if err != nil {
		h.fail(w, "list tokens", err)
		return
	}
	writeJSON(w, http.StatusOK, list)
}

func (h *tokenHandler) create(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	// Size is a pointer here so that an explicit 0 is told apart from a
	// missing size (the default).
	var body struct {
		Size  *sizeField `json:"size"`
		Token string     `json:"token"`
	}
	if !httpapi.DecodeJSON(w, r, &body, maxBody, ErrInvalidSize) {
		return
	}
	req := CreateTokenRequest{Size: 3, Token: body.Token}
	if body.Size != nil {
		req.Size = int(*body.Size)
	}
	if req.Token == "" {
		req.Token = NewToken()
	}
	ctx, cancel := context.WithTimeout(r.Context(), DefaultRequestTimeout)
	defer cancel()
	rev, err := CreateToken(ctx, h.cli, req.Token, req.Size)
	if err != nil {
		h.fail(w, "create token", err)
		return
	}
	h.lg.Info("discovery token created", "token", req.Token, "size", req.Size)
	writeJSON(w, http.StatusCreated, CreateTokenResponse{
		Token: req.Token, Size: req.Size, Endpoints: h.endpoints,
		Flags: MemberFlags(req.Token, h.endpoints), Revision: rev,
	})
}

func (h *tokenHandler) status(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), DefaultRequestTimeout)
	defer cancel()
	st, err := TokenStatus(ctx, h.cli, r.PathValue("token"))
	if err != nil && !errors.Is(err, ErrSizeNotFound) && !errors.Is(err, ErrBadSizeKey) {
		h.fail(w, "token status", err)
		return
	}
	if err != nil {
		// The registrations are still worth showing; the error says what
		// is wrong with the token.
		writeError(w, http.StatusConflict, "failed_precondition", err.Error())
		return
	}
	resp := TokenStatusResponse{Status: st, Registered: st.Registered()}
	if st.State == StateFull {
		if resp.InitialCluster, err = st.InitialCluster(); err != nil {
			writeError(w, http.StatusConflict, "failed_precondition", err.Error())
			return
		}
	}
	writeJSON(w, http.StatusOK, resp)
}

func (h *tokenHandler) remove(w http.ResponseWriter, r *http.Request) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), DefaultRequestTimeout)
	defer cancel()
	token := r.PathValue("token")
	n, err := RemoveToken(ctx, h.cli, token)
	if err != nil {
		h.fail(w, "remove token", err)
		return
	}
	h.lg.Info("discovery token removed", "token", token, "keys", n)
	writeJSON(w, http.StatusOK, RemoveTokenResponse{Token: token, Deleted: n})
}

// fail maps an error to a status and code.
func (h *tokenHandler) fail(w http.ResponseWriter, op string, err error) {
	switch {
	case errors.Is(err, ErrInvalidToken), errors.Is(err, ErrInvalidSize):
		writeError(w, http.StatusBadRequest, "invalid_argument", err.Error())
	case errors.Is(err, ErrTokenNotFound):
		writeError(w, http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, ErrTokenExists):
		writeError(w, http.StatusConflict, "already_exists", err.Error())
	case errors.Is(err, context.DeadlineExceeded), errors.Is(err, context.Canceled):
		writeError(w, http.StatusServiceUnavailable, "unavailable",
			fmt.Sprintf("%s: the discovery registry did not answer within %v: %v", op, DefaultRequestTimeout, err))
	default:
		h.lg.Error("token API failed", "op", op, "err", err)
		writeError(w, http.StatusInternalServerError, "internal", fmt.Sprintf("%s: %v", op, err))
	}
}

func writeJSON(w http.ResponseWriter, code int, v any) { httpapi.WriteJSON(w, code, v) }

func writeError(w http.ResponseWriter, code int, kind, msg string) {
	httpapi.WriteError(w, code, kind, msg)
}

// sizeField is the size of a token in a JSON body: a JSON number that is
// a whole number. One that is not, or too large for an int (1e308), is
// refused stating the range, not as a type error of the decoder.
type sizeField int

// UnmarshalJSON reads a whole number.
func (s *sizeField) UnmarshalJSON(b []byte) error {
	if len(b) == 0 || (b[0] != '-' && (b[0] < '0' || b[0] > '9')) {
		return invalid(ErrInvalidSize, "size %s: want a number, 1 to %d (3, 5 or 7 is usual)", b, MaxSize)
	}
	n, err := strconv.Atoi(string(b))
	if err != nil {
		return invalid(ErrInvalidSize, "size %s: want a whole number, 1 to %d (3, 5 or 7 is usual)", b, MaxSize)
	}
	*s = sizeField(n)
	return nil
}
