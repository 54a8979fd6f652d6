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
	rd, err := r.readiness(ctx, p.Namespace, p.Name, p.UID)
	if err != nil {
		return Visibility{}, err
	}
	return rd.Visibility, nil
}

// podReadiness is Visibility with its Reason in two halves: what was
// found, and what to do.
type podReadiness struct {
	Visibility
	found, do string
}

// readiness says whether pod namespace/name (its UID uid) is Ready in an
// EndpointSlice of its namespace that the registry's selector selects
// (objects.slices: the label readers need), and if not why: in no slice,
// only in slices without the label, or listed there but not Ready (with
// the slice's conditions).
func (r *Registry) readiness(ctx context.Context, namespace, name, uid string) (podReadiness, error) {
	list, _, err := r.listSlices(ctx, namespace, "")
	if err != nil {
		return podReadiness{}, err
	}
	var rd podReadiness
	var unlabelled, notReady, readyIn []string
	for _, s := range list {
		cond, ready, listed := podIn(s, uid)
		if !listed {
			continue
		}
		sname := s.Namespace + "/" + s.Name
		rd.Slices = append(rd.Slices, sname)
		switch {
		case !r.kind.selects(s.Labels):
			unlabelled = append(unlabelled, fmt.Sprintf("EndpointSlice %s (Service %q)", sname, s.Labels[discoveryv1.LabelServiceName]))
		case !ready:
			notReady = append(notReady, fmt.Sprintf("%s (%s)", sname, conditions(cond)))
		default:
			rd.Visible, readyIn = true, append(readyIn, sname)
		}
	}
	pod, labels := namespace+"/"+name, strings.ReplaceAll(r.kind.slices, ",", " ")
	label := "label"
	if strings.Contains(r.kind.slices, ",") {
		label = "labels"
	}
	switch {
	case rd.Visible:
		rd.found = fmt.Sprintf("pod %s is Ready in %s", pod, strings.Join(readyIn, ", "))
	case len(notReady) > 0:
		rd.found = fmt.Sprintf("pod %s is not Ready in %s", pod, strings.Join(notReady, ", "))
		rd.do = "watchers see its instances once its readiness probe passes (a starting or terminating pod is not Ready)"
	case len(unlabelled) > 0:
		lack := "which lacks"
		if len(unlabelled) > 1 {
			lack = "which lack"
		}
		rd.found = fmt.Sprintf("pod %s is listed only in %s, %s the %s %s", pod, strings.Join(unlabelled, ", "), lack, label, labels)
		rd.do = fmt.Sprintf("label the Service (kubectl label service <name> %s); the EndpointSlice controller copies it to the slices", labels)
	default:
		rd.found = fmt.Sprintf("pod %s is in no EndpointSlice", pod)
		rd.do = fmt.Sprintf("create a Service whose selector matches the pod's labels, labelled %s %s; a pod without an IP is listed in none",
			labels, r.kind.services)
	}
	if !rd.Visible {
		rd.Reason = rd.found + ": " + rd.do
	}
	return rd, nil
}

// podIn reports whether the slice lists the pod, whether as ready, and
// the conditions it lists it with (its last endpoint of the pod).
func podIn(s *discoveryv1.EndpointSlice, uid string) (cond discoveryv1.EndpointConditions, ready, listed bool) {
	for _, e := range s.Endpoints {
		if e.TargetRef == nil || e.TargetRef.Kind != "Pod" || string(e.TargetRef.UID) != uid {
			continue
		}
		listed, cond = true, e.Conditions
		if endpointReady(e.Conditions) {
			return cond, true, true
		}
	}
	return cond, false, listed
}

// conditions renders an endpoint's conditions as the slice has them
// ("ready=false, terminating=true"); unset ones are left out.
func conditions(c discoveryv1.EndpointConditions) string {
	var out []string
	for _, f := range []struct {
		name string
		v    *bool
	}{{"ready", c.Ready}, {"serving", c.Serving}, {"terminating", c.Terminating}} {
		if f.v != nil {
			out = append(out, fmt.Sprintf("%s=%v", f.name, *f.v))
		}
	}
	if len(out) == 0 {
		return "no conditions"
	}
	return strings.Join(out, ", ")
}
