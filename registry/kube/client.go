package kube

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
	apierrors "k8s.io/apimachinery/pkg/api/errors"
	metav1 "k8s.io/apimachinery/pkg/apis/meta/v1"
	"k8s.io/apimachinery/pkg/apis/meta/v1/unstructured"
	"k8s.io/apimachinery/pkg/runtime"
	"k8s.io/apimachinery/pkg/runtime/schema"
)

// Every request goes through the dynamic client (and, for the two raw
// paths it lacks, the same HTTP client): the typed clientsets would link
// every API group of Kubernetes into every program that imports this
// package.

var (
	endpointSlicesGVR = schema.GroupVersionResource{Group: "discovery.k8s.io", Version: "v1", Resource: "endpointslices"}
	podsGVR           = schema.GroupVersionResource{Version: "v1", Resource: "pods"}
	accessReviewGVR   = schema.GroupVersionResource{Group: "authorization.k8s.io", Version: "v1", Resource: "selfsubjectaccessreviews"}
	subjectReviewGVR  = schema.GroupVersionResource{Group: "authentication.k8s.io", Version: "v1", Resource: "selfsubjectreviews"}
)

// toSlice converts an EndpointSlice read through the dynamic client.
func toSlice(u *unstructured.Unstructured) (*discoveryv1.EndpointSlice, error) {
	var s discoveryv1.EndpointSlice
	if err := runtime.DefaultUnstructuredConverter.FromUnstructured(u.Object, &s); err != nil {
		return nil, fmt.Errorf("EndpointSlice %s/%s: %w", u.GetNamespace(), u.GetName(), err)
	}
	return &s, nil
}

// listSlices lists the EndpointSlices of ns matching selector ("" for all).
func (r *Registry) listSlices(ctx context.Context, ns, selector string) ([]*discoveryv1.EndpointSlice, string, error) {
	list, err := r.dyn.Resource(endpointSlicesGVR).Namespace(ns).List(ctx, metav1.ListOptions{LabelSelector: selector})
	if err != nil {
		return nil, "", r.explain(op{"list", endpointSlicesResource, ns}, err)
	}
	out := make([]*discoveryv1.EndpointSlice, 0, len(list.Items))
	for i := range list.Items {
		s, err := toSlice(&list.Items[i])
		if err != nil {
			r.log.Warn("skipping an EndpointSlice that does not decode", "err", err)
			continue
		}
		out = append(out, s)
	}
	return out, list.GetResourceVersion(), nil
}

// podUID returns the UID of pod ns/name, or an error matching
// apierrors.IsNotFound.
func (r *Registry) podUID(ctx context.Context, ns, name string) (string, error) {
	uid, _, err := r.podInfo(ctx, ns, name)
	return uid, err
}

// podInfo returns the UID of pod ns/name and the names of its containers
// (init containers too: a sidecar is one), or an error matching
// apierrors.IsNotFound.
func (r *Registry) podInfo(ctx context.Context, ns, name string) (string, []string, error) {
	u, err := r.dyn.Resource(podsGVR).Namespace(ns).Get(ctx, name, metav1.GetOptions{})
	if err != nil {
		return "", nil, err
	}
	var names []string
	for _, field := range []string{"containers", "initContainers"} {
		list, _, _ := unstructured.NestedSlice(u.Object, "spec", field)
		for _, c := range list {
			if m, ok := c.(map[string]any); ok {
				if n, ok := m["name"].(string); ok {
					names = append(names, n)
				}
			}
		}
	}
	return string(u.GetUID()), names, nil
}

// rawGet GETs an API path with the client's credentials and decodes the
// JSON answer into out. A non-2xx answer is an API error (apierrors).
func (r *Registry) rawGet(ctx context.Context, path string, out any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimSuffix(r.host, "/")+path, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Accept", "application/json")
	resp, err := r.http.Do(req)
	if err != nil {
		return err
	}
	defer resp.Body.Close()
	body, err := io.ReadAll(io.LimitReader(resp.Body, 4<<20))
	if err != nil {
		return err
	}
	if resp.StatusCode/100 != 2 {
		var st metav1.Status
		if json.Unmarshal(body, &st) == nil && st.Kind == "Status" {
			return &apierrors.StatusError{ErrStatus: st}
		}
		e := apierrors.NewGenericServerResponse(resp.StatusCode, http.MethodGet, schema.GroupResource{}, "", strings.TrimSpace(string(body)), 0, false)
		if text := strings.TrimSpace(string(body)); text != "" && len(text) < 512 {
			// Not the API server's Status (say, a plain HTTP request to its
			// HTTPS port): what it said is all there is to go on.
			e.ErrStatus.Message = fmt.Sprintf("%s (HTTP %d: %s)", e.ErrStatus.Message, resp.StatusCode, text)
		}
		return e
	}
	if out == nil {
		return nil
	}
	return json.Unmarshal(body, out)
}
