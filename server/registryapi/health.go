package registryapi

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"net/http"
	"reflect"
	"slices"
	"strings"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/registry"
)

// Check is a health check declared in a registration request: beacon.Check
// in its JSON form (durations as strings, "10s"), except that a key it
// does not know is refused — beacon.Check ignores unknown keys, so that
// stored values written by newer versions stay readable, but in a request
// a misspelt "intervall" would silently leave the default in place.
type Check beacon.Check

// checkKeys are the keys of a check's JSON form, as beacon.Check writes
// them.
var checkKeys = func() []string {
	full := beacon.Check{Kind: "k", Path: "/", Service: "s", TTL: 1, Interval: 1, Timeout: 1, Rise: 1, Fall: 1}
	b, err := json.Marshal(full)
	if err != nil {
		panic("registryapi: marshal a check: " + err.Error())
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(b, &m); err != nil {
		panic("registryapi: read a check back: " + err.Error())
	}
	return slices.Sorted(maps.Keys(m))
}()

// UnmarshalJSON reads beacon.Check's JSON, refusing unknown keys.
func (c *Check) UnmarshalJSON(b []byte) error {
	var keys map[string]json.RawMessage
	if err := json.Unmarshal(b, &keys); err != nil || keys == nil {
		return fmt.Errorf(`%w: "check" must be an object such as {"kind":"http","path":"/healthz","interval":"10s"}`, beacon.ErrInvalidCheck)
	}
	for k := range keys {
		if !slices.Contains(checkKeys, k) {
			return fmt.Errorf("%w: unknown field %q in \"check\": a check has %s", beacon.ErrInvalidCheck, k, strings.Join(checkKeys, ", "))
		}
	}
	var bc beacon.Check
	if err := json.Unmarshal(b, &bc); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) {
			return fmt.Errorf("%w: \"check.%s\" is a %s: give %s", beacon.ErrInvalidCheck, te.Field, te.Value, checkValueRule(te))
		}
		return fmt.Errorf("check: %w", err)
	}
	*c = Check(bc)
	return nil
}

// checkValueRule says what a check's field of the wrong JSON type takes.
func checkValueRule(te *json.UnmarshalTypeError) string {
	switch {
	case te.Type.Kind() == reflect.Int:
		return "a whole number"
	case te.Field == "ttl" || te.Field == "interval" || te.Field == "timeout":
		return `a duration string such as "10s"`
	}
	return "a string"
}

// MarshalJSON writes beacon.Check's JSON form.
func (c Check) MarshalJSON() ([]byte, error) { return json.Marshal(beacon.Check(c)) }

// ReportRequest is the optional body of a TTL check's report. It carries
// nothing: the secret goes in the Beacon-Secret header.
type ReportRequest struct {
	// Lease is refused: a lease ID is not proof of ownership.
	Lease string `json:"lease,omitempty"`
}

// report takes a TTL check's report (POST .../{id}/report): the owner's
// word that its service is fine, due at least once per the check's TTL.
func (h *Handler) report(w http.ResponseWriter, r *http.Request) {
	leased, ref, ok := h.ownerRequest(w, r)
	if !ok {
		return
	}
	rep, ok := leased.(registry.TTLReporter) // the Kubernetes registry takes none: readiness is its check
	if !ok {
		writeError(w, http.StatusNotImplemented, "not_implemented",
			"this server's registry backend does not take TTL check reports; declare a grpc, http or tcp check instead")
		return
	}
	var req ReportRequest
	if r.ContentLength != 0 && !decode(w, r, &req) {
		return
	}
	if refuseLease(w, req.Lease) {
		return
	}
	if err := rep.ReportLeased(r.Context(), ref, secret(r)); err != nil {
		h.fail(w, r, err)
		return
	}
	w.WriteHeader(http.StatusNoContent)
}
