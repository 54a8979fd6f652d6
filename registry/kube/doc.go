// Package kube is Beacon's Kubernetes-native registry: a registry.Registry
// over the Kubernetes API, for clusters where running an etcd just so that
// workers find each other is one system too many.
//
// # How it works
//
// Each registering process writes one InstanceSet custom resource
// (discovery.beaconplane.io/v1alpha1, CRD()) in its pod's namespace, named
// after its pod (pod.container in container mode), holding every instance
// it registers in the value format of every other backend. The resource's
// ownerReference names the pod (with its UID), so that Kubernetes' garbage
// collector deletes it with the pod. Writes are server-side applies of the
// whole resource with one field manager ("beacon"), coalesced when
// registrations are concurrent.
//
// An instance is live while its InstanceSet exists and its pod is Ready in
// an EndpointSlice labelled DiscoveryLabel=true (matched by
// targetRef.uid in the pod's own namespace, so a new pod never inherits an
// old pod's readiness, and a slice of another namespace never vouches for
// it). Put the label on the Service that selects the registering pods;
// the EndpointSlice controller copies it to the slices. A pod that is not Ready
// (starting, failing its readiness probe, terminating) is removed for
// watchers, and added back once Ready: the readiness probe gates discovery.
// Draining is the instance's status in the resource, as on every backend.
//
// # Health checks
//
// Readiness is the check of an instance that declares none: it is never
// probed. An instance may declare a grpc, http or tcp check
// (beacon.Instance.Check, stored in the InstanceSet); a ttl check is
// refused (ErrHealthCheck: there is no store for its service's reports;
// an exec readinessProbe does what it would). The checks are run by
// health.Checkers (beacon serve in pods), which keep their verdicts in
// their own process's InstanceSet, beside their own registration
// (spec.verdicts: instance → beacon.Health; Registry.VerdictSink, the
// registry.VerdictKeeper interface), written by the same coalesced
// server-side apply as the instances and garbage-collected with the pod.
// Readers count a set's verdicts only while its pod is Ready in a
// discovery EndpointSlice — while the checker's own registration is live —
// so a checker whose pod stops being Ready or is deleted has its verdicts
// ignored at once (fail-open). Where several Ready pods' sets hold a
// verdict on one instance (a handover), the most recent counts; the old
// owner deletes its own once the new owner's shows. The view, List and Get
// join the verdicts to the instances with the store registries' code
// (registry/internal/healthjoin): unknown until a verdict, the panic
// threshold per service (Config.HealthPanicThreshold).
//
// There is no lease. What replaces each of its guarantees:
//
//   - A crashed process: its pod fails its probes (not Ready: removed) or is
//     deleted (the EndpointSlice drops it: removed; the garbage collector
//     then deletes the InstanceSet).
//   - A clean shutdown: Close deletes the InstanceSet; Registration.Close
//     removes one instance.
//   - An instance removed behind the process's back (kubectl delete): the
//     process follows its own InstanceSet and writes it again (state lost,
//     then recovered).
//   - A registration that cannot be written is retried with backoff until
//     it is; the call that made the change gets the error and its change is
//     undone.
//
// # Reading
//
// List reads both resources from the API server. Watch shares one view per
// registry: for each watched namespace, a reflector (the list-then-watch
// machinery of client-go's informers) follows InstanceSets and one follows
// the discovery EndpointSlices. A re-list (410 Gone, API server restart, a
// failed watch) re-reads every watched resource, and watchers get the
// difference as one Resync once all are re-read, never a phantom removal;
// while the API server cannot be reached, watchers get a Stale batch, then
// a Resync. Watches cannot resume
// from a revision: FromRevision always gives a snapshot.
//
// An InstanceSet edited by hand into something that is not valid (the CRD's
// schema refuses most of it; what it cannot express, Beacon checks) is
// skipped: readers keep the last valid content of that object, count it
// (beacon_kube_invalid_resources_total) and log it.
//
// # The dynamo layout
//
// OpenDynamo opens a read-only registry (Dynamo) of what the NVIDIA Dynamo
// runtime's Kubernetes discovery writes: one DynamoWorkerMetadata
// (nvidia.com/v1alpha1) per worker pod (per container in its container
// mode), owned by the pod, whose spec.data.endpoints and
// spec.data.model_cards hold, by key, the values Dynamo writes in etcd
// under v1/instances/ and v1/mdc/ (event channels are ignored). Package
// dynamo decodes them as it does for the store side: the same names, IDs,
// address, transport and metadata, plus MetaObject and MetaPod, and the
// object's creation time as the registration time; a model card names the
// instances of its own object. The same view, List and Watch serve them:
// an instance is live while its object exists and its pod (the object's
// one Pod ownerReference, by UID) is Ready in an EndpointSlice labelled
// DynamoBackendLabel=kubernetes and DynamoEnabledLabel=true, as Dynamo's
// operator labels its Services. A pod that is not Ready is left out, as
// above, and as Dynamo's own frontends leave it out (Dynamo has no
// draining state to map it to); in container mode an object is live while
// its pod is Ready.
//
// An entry Beacon cannot serve is logged once per version of its object,
// counted (beacon_kube_invalid_entries_total) and skipped, its key keeping
// its last valid entry if it had one; an object nothing of which is valid
// (no Pod owner, or several; no spec.data) is skipped as an invalid
// InstanceSet is. An instance ID that two entries of one object (a padded
// and an unpadded key) or the objects of two Ready pods hold is served by
// none of them, and reported. (The API server keeps JSON numbers as
// int64 or float64, so an instance_id of 2^63 or more, which Dynamo's
// Kubernetes IDs never are, reads as malformed.) Register is refused with
// ErrReadOnly. Reading needs list and watch on
// dynamoworkermetadatas.nvidia.com and endpointslices.discovery.k8s.io
// (deploy/kubernetes/rbac-dynamo.yaml).
//
// Dynamo.Explain says, for one instance, why a Dynamo frontend would or
// would not see it (`beacon dynamo explain --backend kubernetes`):
// dynamo.Explain's checks, over the entries of the resources holding it,
// with each resource's pod (it exists, with the owner's UID; get on pods)
// and that pod's readiness (the same reasons as Visibility, with Dynamo's
// labels) in place of etcd's lease.
//
// # Using it
//
// Programs open it by name with backend.OpenRegistry
// (BEACON_DISCOVERY_BACKEND=kubernetes) after importing this package, or
// with Open. Registering needs the pod's identity from the Downward API
// (POD_NAME, POD_NAMESPACE, POD_UID); readers need none. The manifests
// (CRD, least-privilege RBAC, example Deployments) are in deploy/kubernetes;
// docs/kubernetes.md describes installation, variables, differences from
// etcd and troubleshooting.
package kube
