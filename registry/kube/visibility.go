package kube

import (
	"context"
	"fmt"
	"strings"

	discoveryv1 "k8s.io/api/discovery/v1"
)

// Visibility says whether watchers see this process's instances, and if
// not, why: the first thing to check when instances are "registered but not
// visible".
type Visibility struct {
	// Visible is true when the pod is Ready in an EndpointSlice labelled
	// DiscoveryLabel.
	Visible bool
	// Reason says, when not Visible, what is missing and how to fix it.
	Reason string
	// Slices names the EndpointSlices listing the pod (namespace/name).
	Slices []string
}

// Visibility checks whether the pod (Config.Pod) is Ready in an
// EndpointSlice labelled DiscoveryLabel=true, the condition for watchers to
// see the instances this process registers. It needs the pod identity and
// list access to EndpointSlices in the pod's namespace.
func (r *Registry) Visibility(ctx context.Context) (Visibility, error) {
	p := r.cfg.Pod
	if err := p.check(); err != nil {
		return Visibility{}, err
	}
	list, _, err := r.listSlices(ctx, p.Namespace, "")
	if err != nil {
		return Visibility{}, err
	}
	var vis Visibility
	var unlabelled, notReady []string
	for _, s := range list {
		state, listed := podIn(s, p.UID)
		if !listed {
			continue
		}
		name := s.Namespace + "/" + s.Name
		vis.Slices = append(vis.Slices, name)
		svc := s.Labels[discoveryv1.LabelServiceName]
		switch {
		case s.Labels[DiscoveryLabel] != DiscoveryLabelValue:
			unlabelled = append(unlabelled, fmt.Sprintf("EndpointSlice %s (Service %q)", name, svc))
		case !state:
			notReady = append(notReady, name)
		default:
			vis.Visible = true
		}
	}
	switch {
	case vis.Visible:
	case len(notReady) > 0:
		vis.Reason = fmt.Sprintf("pod %s/%s is not Ready in %s: watchers see its instances once its readiness probe "+
			"passes (a starting or terminating pod is not Ready)", p.Namespace, p.Name, strings.Join(notReady, ", "))
	case len(unlabelled) > 0:
		lack := "which lacks"
		if len(unlabelled) > 1 {
			lack = "which lack"
		}
		vis.Reason = fmt.Sprintf("pod %s/%s is listed only in %s, %s the label %s=%s: label the Service "+
			"(kubectl label service <name> %s=%s); the EndpointSlice controller copies it to the slices",
			p.Namespace, p.Name, strings.Join(unlabelled, ", "), lack, DiscoveryLabel, DiscoveryLabelValue, DiscoveryLabel, DiscoveryLabelValue)
	default:
		vis.Reason = fmt.Sprintf("pod %s/%s is in no EndpointSlice: create a Service whose selector matches the pod's "+
			"labels, labelled %s=%s (see deploy/kubernetes/worker.yaml); a pod without an IP is listed in none",
			p.Namespace, p.Name, DiscoveryLabel, DiscoveryLabelValue)
	}
	return vis, nil
}

// podIn reports whether the slice lists the pod, and whether as ready.
func podIn(s *discoveryv1.EndpointSlice, uid string) (ready, listed bool) {
	for _, e := range s.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || string(e.TargetRef.UID) != uid {
			continue
		}
		listed = true
		if endpointReady(e.Conditions) {
			return true, true
		}
	}
	return false, listed
}
