package server

import (
	"net/http"
	"slices"
	"strings"

	"github.com/beaconplane/beacon/internal/httpapi"
)

// Cross-site request forgery. A browser attaches the credentials it holds
// for the server (HTTP Basic credentials typed into its prompt, a client
// certificate) to requests that pages of other origins make, and some of
// those need no CORS preflight: a form's POST, a no-cors fetch. Such a
// page could make a signed-in operator's browser drain or deregister
// instances (the operator actions are POSTs without a body) or create
// tokens. So every request with a method that changes state is refused
// when the browser says it comes from another origin (Sec-Fetch-Site, or
// an Origin that is not the server's), unless that origin is one of
// --cors-allowed-origins ("*": every origin, no check). Clients that are
// not browsers send neither header and are not affected; the dashboard is
// same-origin. "A method that changes state" includes the GETs that do,
// kept for compatibility (writesDespiteMethod): a cross-site page could
// create tokens with an image tag.

// crossOriginGuard wraps h with net/http's CrossOriginProtection, trusting
// the CORS allowed origins, and applies it also to the requests
// writesDespiteMethod names, whatever their method.
func crossOriginGuard(origins []string, originsSetting string, h http.Handler) (http.Handler, error) {
	if slices.Contains(origins, "*") {
		return h, nil
	}
	p := http.NewCrossOriginProtection()
	for _, o := range origins {
		if err := p.AddTrustedOrigin(strings.ToLower(strings.TrimSuffix(o, "/"))); err != nil {
			return nil, err
		}
	}
	deny := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		origin := r.Header.Get("Origin")
		if origin == "" {
			origin = "another origin"
		}
		httpapi.WriteError(w, http.StatusForbidden, "permission_denied",
			"cross-origin request refused: a page of "+origin+" may not change this server's state with the browser's credentials "+
				"(cross-site request forgery); if the page is yours, allow its origin with "+originsSetting)
	})
	p.SetDenyHandler(deny)
	checked := p.Handler(h)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if safeMethod(r.Method) && writesDespiteMethod(r) {
			// Checked as the write it is: CrossOriginProtection lets
			// every GET, HEAD and OPTIONS through.
			as := r.WithContext(r.Context())
			as.Method = http.MethodPost
			if p.Check(as) != nil {
				deny.ServeHTTP(w, r)
				return
			}
		}
		checked.ServeHTTP(w, r)
	}), nil
}

func safeMethod(m string) bool {
	return m == http.MethodGet || m == http.MethodHead || m == http.MethodOptions
}

// writesDespiteMethod reports the requests that change state although
// their method is GET (or HEAD): v2 discovery's /new creates a token
// (discovery.etcd.io's protocol uses GET). Every other route that writes
// takes POST, PUT, PATCH or DELETE. The CSRF check and the permission
// check (guardV2) both use it.
func writesDespiteMethod(r *http.Request) bool {
	return strings.TrimSuffix(r.URL.Path, "/") == V2Path+"/new"
}
