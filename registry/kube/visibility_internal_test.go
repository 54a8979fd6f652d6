package kube

import (
	"testing"

	corev1 "k8s.io/api/core/v1"
	discoveryv1 "k8s.io/api/discovery/v1"
	"k8s.io/apimachinery/pkg/types"
)

// A slice counts for readiness only with every label of its kind's
// selector, with its value: Dynamo's two, Beacon's one.
func TestSelects(t *testing.T) {
	both := map[string]string{DynamoBackendLabel: DynamoBackendLabelValue, DynamoEnabledLabel: DynamoEnabledLabelValue}
	for _, tc := range []struct {
		kind   *objects
		labels map[string]string
		want   bool
	}{
		{dynamoObjects, both, true},
		{dynamoObjects, map[string]string{DynamoBackendLabel: DynamoBackendLabelValue, DynamoEnabledLabel: DynamoEnabledLabelValue, "x": "y"}, true},
		{dynamoObjects, map[string]string{DynamoBackendLabel: DynamoBackendLabelValue}, false},
		{dynamoObjects, map[string]string{DynamoEnabledLabel: DynamoEnabledLabelValue}, false},
		{dynamoObjects, map[string]string{DynamoBackendLabel: "etcd", DynamoEnabledLabel: DynamoEnabledLabelValue}, false},
		{dynamoObjects, map[string]string{DiscoveryLabel: DiscoveryLabelValue}, false},
		{instanceSets, map[string]string{DiscoveryLabel: DiscoveryLabelValue}, true},
		{instanceSets, map[string]string{DiscoveryLabel: "false"}, false},
		{instanceSets, both, false},
		{instanceSets, nil, false},
	} {
		if got := tc.kind.selects(tc.labels); got != tc.want {
			t.Errorf("%s selects %v = %v, want %v", tc.kind.kind, tc.labels, got, tc.want)
		}
	}
}

// An endpoint's conditions are shown as the slice has them, unset ones
// left out; podIn reports the conditions of the pod it lists.
func TestConditions(t *testing.T) {
	yes, no := true, false
	for _, tc := range []struct {
		c    discoveryv1.EndpointConditions
		want string
	}{
		{discoveryv1.EndpointConditions{}, "no conditions"},
		{discoveryv1.EndpointConditions{Ready: &no}, "ready=false"},
		{discoveryv1.EndpointConditions{Ready: &no, Serving: &yes, Terminating: &yes}, "ready=false, serving=true, terminating=true"},
		{discoveryv1.EndpointConditions{Serving: &no, Terminating: &no}, "serving=false, terminating=false"},
	} {
		if got := conditions(tc.c); got != tc.want {
			t.Errorf("conditions(%+v) = %q, want %q", tc.c, got, tc.want)
		}
	}
	pod := func(uid string, ready bool) discoveryv1.Endpoint {
		return discoveryv1.Endpoint{TargetRef: &corev1.ObjectReference{Kind: "Pod", UID: types.UID(uid)},
			Conditions: discoveryv1.EndpointConditions{Ready: &ready, Terminating: &no}}
	}
	s := &discoveryv1.EndpointSlice{Endpoints: []discoveryv1.Endpoint{pod("a", true), pod("b", false)}}
	if c, ready, listed := podIn(s, "b"); ready || !listed || conditions(c) != "ready=false, terminating=false" {
		t.Errorf("podIn(b) = %q, %v, %v", conditions(c), ready, listed)
	}
	if _, ready, listed := podIn(s, "a"); !ready || !listed {
		t.Errorf("podIn(a) = %v, %v", ready, listed)
	}
	if _, ready, listed := podIn(s, "c"); ready || listed {
		t.Errorf("podIn(c) = %v, %v", ready, listed)
	}
}
