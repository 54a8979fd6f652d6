// The page's copy of the registry, fed by the watch stream: instances by
// key, a namespace → component → endpoint tree with serving, draining and
// failing counts, a timeline of events, and the instance count of every tree node
// over the last minutes (for sparklines). Applying a message only marks
// what changed; the views render once per animation frame.

import { metaText, visible } from './format.js';

export const MAX_EVENTS = 10000;
export const HISTORY_MS = 10 * 60 * 1000;
const MAX_CHANGES = 100000;
const HISTORY_STEP_MS = 1000;

// healthOf is the checkers' verdict on an instance as the page shows it:
// '' when it declares no check, 'unknown' until a verdict exists,
// 'passing', 'failing' (left out of routing, as a draining instance is) or
// 'panic' (failing in a service in panic: served anyway).
export function healthOf(inst) {
  const h = inst.health;
  if (!h) return inst.check ? 'unknown' : '';
  if (h.status === 'failing') return h.panic ? 'panic' : 'failing';
  return h.status === 'passing' ? 'passing' : 'unknown';
}

// HEALTH_TEXT is how each healthOf value reads.
export const HEALTH_TEXT = { '': '–', unknown: 'unknown', passing: 'passing', failing: 'failing', panic: 'failing (panic)' };

export function keyOf(inst) {
  return `${inst.namespace}/${inst.component}/${inst.endpoint}/${inst.id}`;
}

// Rec is one instance as the page holds it, with derived fields. A Rec
// keeps its identity across updates; v counts its changes, so that views
// re-render a row only when its Rec or v changed.
export class Rec {
  constructor(inst) {
    this.key = keyOf(inst);
    this.service = `${inst.namespace}/${inst.component}/${inst.endpoint}`;
    this.v = 0;
    this.set(inst);
  }

  set(inst) {
    this.inst = inst;
    this.v += 1;
    this.draining = inst.status === 'draining';
    this.health = healthOf(inst);
    this.failing = this.health === 'failing';
    this.meta = metaText(inst.metadata);
    this.search = `${this.key} ${inst.address} ${inst.transport || ''} ${inst.status || 'serving'} ${HEALTH_TEXT[this.health]} ${this.meta}`.toLowerCase();
    this.registeredMs = Date.parse(inst.registered_at) || 0;
    this.addrKey = addressKey(inst.address);
  }
}

// addressKey sorts IPv4 host:port addresses numerically (10.0.0.9:80
// before 10.0.0.10:80); other addresses sort as text, after them.
function addressKey(addr) {
  const m = /^(\d{1,3})\.(\d{1,3})\.(\d{1,3})\.(\d{1,3})(?::(\d{1,5}))?$/.exec(addr);
  if (!m) return `~${addr.toLowerCase()}`;
  return m.slice(1, 5).map((o) => o.padStart(3, '0')).join('.') + ':' + (m[5] || '').padStart(5, '0');
}

// Node is a namespace (level 1), component (2) or endpoint (3); the root
// (level 0) holds the namespaces. version changes whenever anything under
// the node changes.
export class Node {
  constructor(name, key, level, parent) {
    this.name = name;
    this.key = key;
    this.level = level;
    this.parent = parent;
    this.children = new Map();
    this.sortedCache = null;
    this.serving = 0;
    this.draining = 0;
    this.failing = 0; // of serving and draining: those whose check fails
    this.endpoints = 0;
    this.version = 0;
    this.recs = level === 3 ? new Map() : null;
  }

  get total() {
    return this.serving + this.draining;
  }

  sorted() {
    if (!this.sortedCache) {
      this.sortedCache = [...this.children.values()].sort((a, b) => (a.name < b.name ? -1 : a.name > b.name ? 1 : 0));
    }
    return this.sortedCache;
  }

  // each calls fn for every Rec under the node.
  each(fn) {
    if (this.recs) {
      for (const r of this.recs.values()) fn(r);
      return;
    }
    for (const c of this.children.values()) c.each(fn);
  }
}

function sameInstance(a, b) {
  if (a.address !== b.address || a.transport !== b.transport || (a.status || 'serving') !== (b.status || 'serving')) return false;
  if (a.registered_at !== b.registered_at) return false;
  if (JSON.stringify(a.health || null) !== JSON.stringify(b.health || null) || JSON.stringify(a.check || null) !== JSON.stringify(b.check || null)) return false;
  const am = a.metadata || {};
  const bm = b.metadata || {};
  const ak = Object.keys(am);
  if (ak.length !== Object.keys(bm).length) return false;
  return ak.every((k) => Object.prototype.hasOwnProperty.call(bm, k) && am[k] === bm[k]);
}

function describeUpdate(prev, next) {
  const parts = [];
  if (prev.address !== next.address) parts.push(`address ${prev.address} → ${next.address}`);
  if ((prev.transport || '') !== (next.transport || '')) parts.push(`transport ${prev.transport || '–'} → ${next.transport || '–'}`);
  if ((prev.status || 'serving') !== (next.status || 'serving')) parts.push(`status ${prev.status || 'serving'} → ${next.status || 'serving'}`);
  const ph = healthOf(prev);
  const nh = healthOf(next);
  const reason = next.health && next.health.reason ? `: ${visible(next.health.reason)}` : '';
  if (ph !== nh) parts.push(`health ${HEALTH_TEXT[ph]} → ${HEALTH_TEXT[nh]}${nh === 'failing' || nh === 'panic' ? reason : ''}`);
  else if (nh === 'failing' && reason && (prev.health.reason || '') !== next.health.reason) parts.push(`health failing${reason}`);
  const pm = prev.metadata || {};
  const nm = next.metadata || {};
  const changed = [];
  for (const k of new Set([...Object.keys(pm), ...Object.keys(nm)])) {
    if (pm[k] !== nm[k]) changed.push(k);
  }
  if (changed.length) parts.push(`metadata ${changed.sort().slice(0, 4).join(', ')}${changed.length > 4 ? ', …' : ''}`);
  return parts.join('; ') || 'rewritten';
}

export class Model {
  constructor() {
    this.recs = new Map();
    this.root = new Node('', '', 0, null);
    this.revision = 0;
    this.synced = false;
    this.scopes = new Set(); // scopes that had their snapshot
    this.expected = new Set(['']); // scopes the page watches
    this.since = 0; // when the page first saw the registry
    this.events = [];
    this.eventSeq = 0;
    this.history = new Map();
    this.changes = [];
    this.changeSeq = 0;
    this.touched = new Set();
    this.dirty = new Set();
    this.onchange = () => {};
  }

  mark(what) {
    this.dirty.add(what);
    this.onchange();
  }

  takeDirty() {
    const d = this.dirty;
    this.dirty = new Set();
    return d;
  }

  node(path) {
    let n = this.root;
    for (const part of path) {
      n = n.children.get(part);
      if (!n) return null;
    }
    return n;
  }

  // snapshot replaces the state under scope ('' for everything, or one
  // namespace when the page watches namespaces one by one). A scope's
  // first snapshot fills the page; a later one (a resumed stream whose
  // changes were compacted away) is applied as the difference against
  // what the page shows, logged as a resync.
  snapshot(msg, scope = '') {
    const now = Date.now();
    const incoming = msg.instances || [];
    if (!this.scopes.has(scope)) {
      this.scopes.add(scope);
      if (!this.since) this.since = now;
      for (const inst of incoming) this.upsert(inst, msg.revision, 'snapshot', now, false);
      // The counts at the moment the page starts watching.
      this.recordHistory(now);
      this.log({ kind: 'system', rev: msg.revision, t: now, detail: `snapshot${scope ? ` of ${scope}` : ''}: ${incoming.length} instance${incoming.length === 1 ? '' : 's'}` });
    } else {
      const prefix = scope ? `${scope}/` : '';
      const keep = new Set();
      for (const inst of incoming) keep.add(keyOf(inst));
      let changes = 0;
      for (const rec of [...this.recs.values()]) {
        if (rec.key.startsWith(prefix) && !keep.has(rec.key)) changes += this.remove(rec.inst, msg.revision, 'resync', now);
      }
      for (const inst of incoming) changes += this.upsert(inst, msg.revision, 'resync', now, true);
      this.log({ kind: 'system', rev: msg.revision, t: now, detail: `re-listed${scope ? ` ${scope}` : ''} after reconnecting: ${changes} change${changes === 1 ? '' : 's'}` });
    }
    this.synced = [...this.expected].every((sc) => this.scopes.has(sc));
    if (msg.revision > this.revision) this.revision = msg.revision;
    this.mark('sync');
  }

  // watch sets the scopes the page follows; the page is synced once each
  // has had its snapshot. Instances outside the new scopes are dropped
  // (the caller may no longer read them).
  watch(scopes) {
    this.expected = new Set(scopes);
    const inScope = (key) => this.expected.has('') || [...this.expected].some((sc) => key.startsWith(`${sc}/`));
    const now = Date.now();
    for (const rec of [...this.recs.values()]) {
      if (!inScope(rec.key)) this.remove(rec.inst, this.revision, 'scope', now, false);
    }
    for (const sc of [...this.scopes]) {
      if (!this.expected.has(sc)) this.scopes.delete(sc);
    }
    this.synced = [...this.expected].every((sc) => this.scopes.has(sc));
    this.mark('sync');
  }

  // change applies an added, updated or removed event. Replays (a resumed
  // stream repeating part of a batch) change nothing.
  change(type, msg) {
    const now = Date.now();
    if (type === 'removed') this.remove(msg.instance, msg.revision, msg.batch, now);
    else this.upsert(msg.instance, msg.revision, msg.batch, now, true);
    if (msg.revision > this.revision) this.revision = msg.revision;
  }

  // markSynced records a resumed stream's "up to date at rev".
  markSynced(rev) {
    if (rev > this.revision) this.revision = rev;
    this.mark('sync');
  }

  system(detail) {
    this.log({ kind: 'system', rev: this.revision, t: Date.now(), detail });
  }

  upsert(inst, rev, batch, now, logIt) {
    const key = keyOf(inst);
    const rec = this.recs.get(key);
    if (rec) {
      const prev = rec.inst;
      if (sameInstance(prev, inst)) return 0;
      const wasDraining = rec.draining;
      const wasFailing = rec.failing;
      rec.set(inst);
      this.logChange('update', rec);
      const ep = this.node([inst.namespace, inst.component, inst.endpoint]);
      if (wasDraining !== rec.draining) this.count(ep, rec.draining ? -1 : 1, rec.draining ? 1 : -1);
      if (wasFailing !== rec.failing) this.count(ep, 0, 0, rec.failing ? 1 : -1);
      this.bump(ep);
      let kind = 'update';
      if (!wasDraining && rec.draining) kind = 'drain';
      else if (wasDraining && !rec.draining) kind = 'undrain';
      else if (!wasFailing && rec.failing) kind = 'fail';
      else if (wasFailing && !rec.failing) kind = 'recover';
      if (logIt) this.log({ kind, inst, prev, rev, batch, t: now, detail: describeUpdate(prev, inst) });
      this.mark('instances');
      return 1;
    }
    const created = new Rec(inst);
    this.logChange('add', created);
    this.recs.set(key, created);
    let n = this.root;
    let structural = false;
    const parts = [inst.namespace, inst.component, inst.endpoint];
    for (let i = 0; i < 3; i += 1) {
      let c = n.children.get(parts[i]);
      if (!c) {
        c = new Node(parts[i], parts.slice(0, i + 1).join('/'), i + 1, n);
        n.children.set(parts[i], c);
        n.sortedCache = null;
        structural = true;
        if (i === 2) {
          for (let p = n; p; p = p.parent) p.endpoints += 1;
        }
      }
      n = c;
    }
    n.recs.set(key, created);
    this.count(n, created.draining ? 0 : 1, created.draining ? 1 : 0, created.failing ? 1 : 0);
    this.bump(n);
    if (structural) this.mark('structure');
    if (logIt) this.log({ kind: 'join', inst, rev, batch, t: now, detail: '' });
    this.mark('instances');
    return 1;
  }

  remove(inst, rev, batch, now, logIt = true) {
    const key = keyOf(inst);
    const rec = this.recs.get(key);
    if (!rec) return 0;
    this.recs.delete(key);
    this.logChange('remove', rec);
    let n = this.node([inst.namespace, inst.component, inst.endpoint]);
    n.recs.delete(key);
    this.count(n, rec.draining ? 0 : -1, rec.draining ? -1 : 0, rec.failing ? -1 : 0);
    this.bump(n);
    // Drop nodes left empty.
    while (n && n.level > 0 && n.total === 0) {
      const p = n.parent;
      p.children.delete(n.name);
      p.sortedCache = null;
      if (n.level === 3) {
        for (let q = p; q; q = q.parent) q.endpoints -= 1;
      }
      this.mark('structure');
      n = p;
    }
    if (logIt) this.log({ kind: 'leave', inst: rec.inst, rev, batch, t: now, detail: '' });
    this.mark('instances');
    return 1;
  }

  // logChange records what happened to a Rec, so that views can update
  // their sorted lists in place (changesSince) instead of rebuilding them.
  logChange(kind, rec) {
    this.changeSeq += 1;
    this.changes.push({ seq: this.changeSeq, kind, rec });
    if (this.changes.length > MAX_CHANGES) {
      this.changes.splice(0, this.changes.length - MAX_CHANGES / 2);
    }
  }

  // changesSince returns the changes after seq, or null when they are no
  // longer kept (the caller rebuilds).
  changesSince(seq) {
    const ch = this.changes;
    if (seq === this.changeSeq) return [];
    if (ch.length === 0 || ch[0].seq > seq + 1) return null;
    let i = ch.length - 1;
    while (i > 0 && ch[i - 1].seq > seq) i -= 1;
    return ch.slice(i);
  }

  count(ep, dServing, dDraining, dFailing = 0) {
    for (let n = ep; n; n = n.parent) {
      n.serving += dServing;
      n.draining += dDraining;
      n.failing += dFailing;
      this.touched.add(n.key);
    }
  }

  bump(ep) {
    for (let n = ep; n; n = n.parent) n.version += 1;
  }

  log(entry) {
    this.eventSeq += 1;
    entry.seq = this.eventSeq;
    if (entry.inst) entry.key = keyOf(entry.inst);
    this.events.push(entry);
    if (this.events.length > MAX_EVENTS + 1000) {
      this.events.splice(0, this.events.length - MAX_EVENTS);
      this.mark('events-trimmed');
    }
    this.mark('events');
  }

  // recordHistory samples the count of every node that changed, at most
  // one sample per node per second, and forgets samples older than the
  // window (keeping the one that gives the count at its start).
  recordHistory(now) {
    if (this.touched.size === 0) return;
    for (const key of this.touched) {
      const n = key === '' ? this.root : this.node(key.split('/'));
      const value = n ? n.total : 0;
      let h = this.history.get(key);
      if (!h) {
        h = [];
        this.history.set(key, h);
      }
      const last = h[h.length - 1];
      if (last && now - last.t < HISTORY_STEP_MS && h.length > 1) last.n = value;
      else if (!last || last.n !== value) h.push({ t: now, n: value });
      let drop = 0;
      while (drop + 1 < h.length && h[drop + 1].t < now - HISTORY_MS) drop += 1;
      if (drop) h.splice(0, drop);
    }
    this.touched.clear();
    // Forget the nodes gone for longer than the window (churn of names
    // must not grow the page's memory).
    if (now - (this.sweptAt || 0) > 60000) {
      this.sweptAt = now;
      for (const [key, h] of this.history) {
        const last = h[h.length - 1];
        if (last.n === 0 && last.t < now - HISTORY_MS) this.history.delete(key);
      }
    }
    // Called from the frame itself: mark without asking for another frame.
    this.dirty.add('history');
  }

  series(key) {
    return this.history.get(key) || [];
  }
}
