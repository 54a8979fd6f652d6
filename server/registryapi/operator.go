package registryapi

import (
	"errors"
	"fmt"
	"net/http"

	"github.com/beaconplane/beacon"
	"github.com/beaconplane/beacon/internal/httpapi"
	"github.com/beaconplane/beacon/registry"
	"github.com/beaconplane/beacon/store"
)

// Operator actions: drain or deregister an instance someone else
// registered, for an operator (the dashboard's Drain and Deregister).
//
//	POST /v1/registry/instances/{ns}/{c}/{e}/{id}/drain       → 200, the instance as stored (draining)
//	POST /v1/registry/instances/{ns}/{c}/{e}/{id}/deregister  → 204
//
// They are separate routes, not the owner's PATCH and DELETE without a
// secret: an owner that forgets its secret still gets the answer of a
// missing instance, and a request says which of the two it means.
//
// There is no secret: the request acts as its authenticated etcd user
// (Config.Operators), and etcd's roles decide, exactly as if the user ran
// etcdctl: readwrite on the namespace's instance prefix. A server without
// authentication has no operator identity and refuses them with 403; a
// registry without the capability (registry.Operator) answers 501.

// OperatorRequest is the optional body of an operator action. It carries
// nothing: the request acts as its authenticated etcd user.
type OperatorRequest struct{}

// operatorFor returns the registry through which the request acts as an
// operator, and the operator's name for the logs, or answers why not.
func (h *Handler) operatorFor(w http.ResponseWriter, r *http.Request) (registry.Operator, string, bool) {
	if _, ok := h.reg.(registry.Operator); !ok {
		writeNoOperator(w)
		return nil, "", false
	}
	if c, ok := h.reg.(interface{ CheckWritable(string) error }); ok {
		if err := c.CheckWritable("drain or deregister an instance"); err != nil { // --layout dynamo
			h.fail(w, r, err)
			return nil, "", false
		}
	}
	var (
		d   registry.Discoverer
		who string
	)
	if h.operators != nil {
		d, who = h.operators(r)
	}
	if d == nil {
		writeError(w, http.StatusForbidden, "permission_denied",
			"operator actions (drain or deregister an instance that another client registered) act as an authenticated etcd user, "+
				"and this server authenticates nobody: run it with "+h.setting.Name("registryapi.Config.Operators")+" (or front an etcd cluster with authentication enabled) "+
				"and sign in as a user with readwrite permission on the namespace's instance prefix (`beacon auth grant-namespace ROLE NAMESPACE`); "+
				"the client that registered an instance changes it with its "+SecretHeader+" (PATCH status draining, DELETE)")
		return nil, "", false
	}
	op, ok := d.(registry.Operator)
	if !ok {
		writeNoOperator(w)
		return nil, "", false
	}
	return op, who, true
}

func writeNoOperator(w http.ResponseWriter) {
	writeError(w, http.StatusNotImplemented, "not_implemented",
		"this server's registry backend cannot drain or deregister instances for operators; "+
			"with the kubernetes backend, drain from the registering process (Registration.Drain; beacon register --drain "+
			"when stopped) or take its pod out of service (kubectl delete pod, or a failing readiness probe): the process "+
			"writes back any edit of its InstanceSet")
}

// operatorRequest checks what every operator action takes: no query, a
// valid instance path, no secret, an optional empty JSON body.
func operatorRequest(w http.ResponseWriter, r *http.Request) (beacon.Ref, bool) {
	if _, ok := httpapi.CheckQuery(w, r); !ok {
		return beacon.Ref{}, false
	}
	ref, ok := pathRef(w, r)
	if !ok {
		return beacon.Ref{}, false
	}
	if r.Header.Get(SecretHeader) != "" {
		writeError(w, http.StatusBadRequest, "invalid_argument",
			"operator actions act as the authenticated etcd user and take no "+SecretHeader+": the client that registered the instance "+
				"drains it with PATCH {\"status\":\"draining\"} and deregisters it with DELETE, with its secret")
		return beacon.Ref{}, false
	}
	var req OperatorRequest
	if r.ContentLength != 0 && !decode(w, r, &req) {
		return beacon.Ref{}, false
	}
	return ref, true
}

// operatorAction checks an operator's request (operatorRequest) and finds
// the operator it acts as (operatorFor).
func (h *Handler) operatorAction(w http.ResponseWriter, r *http.Request) (registry.Operator, string, beacon.Ref, bool) {
	ref, ok := operatorRequest(w, r)
	if !ok {
		return nil, "", ref, false
	}
	op, who, ok := h.operatorFor(w, r)
	return op, who, ref, ok
}

func (h *Handler) operatorDrain(w http.ResponseWriter, r *http.Request) {
	op, who, ref, ok := h.operatorAction(w, r)
	if !ok {
		return
	}
	in, err := op.DrainInstance(r.Context(), ref)
	if err != nil {
		h.failOperator(w, r, "drain", err)
		return
	}
	h.log.Info("drained by an operator", "instance", ref.String(), "operator", who)
	writeJSON(w, http.StatusOK, in)
}

func (h *Handler) operatorDeregister(w http.ResponseWriter, r *http.Request) {
	op, who, ref, ok := h.operatorAction(w, r)
	if !ok {
		return
	}
	if err := op.DeregisterInstance(r.Context(), ref); err != nil {
		h.failOperator(w, r, "deregister", err)
		return
	}
	h.quota.releaseRegistration(ref)
	h.log.Info("deregistered by an operator", "instance", ref.String(), "operator", who)
	w.WriteHeader(http.StatusNoContent)
}

// failOperator answers an operator action's error: a permission error
// says what to grant; the others as for any request.
func (h *Handler) failOperator(w http.ResponseWriter, r *http.Request, action string, err error) {
	if !errors.Is(err, store.ErrPermissionDenied) {
		h.fail(w, r, err)
		return
	}
	ns := r.PathValue("namespace")
	prefix := "/services/" + ns + "/"
	if k, ok := h.reg.(interface{ Keyspace() beacon.Keyspace }); ok {
		prefix = k.Keyspace().Prefix(beacon.Query{Namespace: ns})
	}
	writeError(w, http.StatusForbidden, "permission_denied", fmt.Sprintf(
		"permission denied: %s may not %s instances in namespace %q: grant it a role with readwrite on the key prefix %s "+
			"(`beacon auth grant-namespace ROLE %s` grants it) (%v)", h.quota.client(r), action, ns, prefix, ns, err))
}
