// Package ui is Beacon's web dashboard, served by `beacon serve` at /ui/
// on its HTTP listener (and / redirects there).
//
// The dashboard is plain modern JavaScript (ES modules) and hand-written
// CSS, embedded in the binary with go:embed: no build step, no CDN, no
// external font. It shows
//
//   - Services: the namespace → component → endpoint tree with serving,
//     draining and failing counts, filters, the instances under the
//     selected node (address, transport, status, health — a failing row
//     marked, panic shown —, metadata, age) and a sparkline of the
//     instance count over the last ten minutes;
//   - Events: joins, updates, drains, failing and passing health checks
//     and leaves, newest first, filterable, each with its store revision;
//   - Cluster: the etcd members (name, ID, URLs, leader, raft term, DB size,
//     revision, health) or another backend's health, and the registry
//     session, from GET /v1/cluster;
//   - Bootstrap: a discovery token's size and registered members, from the
//     token API.
//
// Everything live comes from one watch of the registry API
// (/v1/registry/watch, Server-Sent Events) read with fetch, so that the
// page notices a silent stream (Config.StreamSilence) and resumes it with
// Last-Event-ID. The page renders at most once per animation frame and
// only the rows in view, so it stays responsive with tens of thousands of
// instances.
//
// Instance names and metadata are untrusted: the scripts build the DOM
// with textContent and DOM APIs only, and every response carries a
// Content-Security-Policy (ContentSecurityPolicy) that forbids inline
// script. The dashboard is read-only by default: it offers an action
// (removing a discovery token; draining or deregistering an instance, for
// a user signed in with etcd authentication who may write its namespace)
// only where GET /v1/auth/whoami says the HTTP API allows the caller, asks
// for confirmation in a modal dialog, and lets the API decide.
//
// Handler serves the assets under Prefix+"assets/" (404 when unknown) and
// the application page for every other path under Prefix (the page routes
// on the client). docs/dashboard.md describes the pages.
package ui
