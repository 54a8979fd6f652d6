// Beacon dashboard: the application shell. It follows the registry through
// one watch stream (/v1/registry/watch), keeps the page's copy in a Model,
// and renders the current view at most once per animation frame, however
// fast events arrive.

import { h, isTyping, setAttr, setText, show } from './dom.js';
import { num, plural } from './format.js';
import { Model } from './model.js';
import { BASE, parseRoute } from './router.js';
import { Stream } from './stream.js';
import { fetchJSON } from './views/common.js';
import { ServicesView } from './views/services.js';
import { EventsView } from './views/events.js';
import { ClusterView } from './views/cluster.js';
import { BootstrapView } from './views/bootstrap.js';
import { NotFoundView } from './views/notfound.js';

// Streams a page opens at most: HTTP/1.1 browsers keep 6 connections per
// server, and the pages need some for their requests.
const MAX_STREAMS = 4;

const VIEWS = {
  services: ServicesView,
  events: EventsView,
  cluster: ClusterView,
  bootstrap: BootstrapView,
  notfound: NotFoundView,
};

class App {
  constructor() {
    this.model = new Model();
    this.main = document.getElementById('main');
    this.liveEl = document.getElementById('live');
    this.liveText = this.liveEl.querySelector('.live-text');
    this.bannerEl = document.getElementById('banner');
    this.summaryEl = document.getElementById('summary');
    this.whoEl = document.getElementById('who');
    this.conn = { state: 'connecting', attempt: 0 };
    this.everLive = false;
    this.view = null;
    this.section = '';
    this.framePending = false;
    this.extraDirty = new Set();
    this.pendingSnapshot = null;
    // Diagnostics, read by the browser tests and documented in
    // docs/dashboard.md: how long rendering takes.
    this.stats = { frames: 0, lastFrameMs: 0, maxFrameMs: 0, frameMsOver16: 0, snapshots: [], events: 0 };
    const silence = Number(document.querySelector('meta[name="beacon-stream-silence-ms"]')?.content);
    this.silenceMs = silence > 0 ? silence : 45000;
    this.model.onchange = () => this.schedule();
    // One watch stream per scope: everything (''), or, for a user who may
    // read only some namespaces, one per namespace.
    this.streams = new Map();
    // What the server offers (/v1/cluster features) and, where it has
    // authentication, who the caller is (/v1/auth/whoami).
    this.features = null;
    this.identity = null;
    this.scopeNote = '';
  }

  // may reports whether the HTTP API allows the caller an action, as the
  // server says (whoami); without that answer, nothing is offered.
  // Operator actions on instances ('instances.operate', in namespace ns)
  // need a signed-in etcd user: never without authentication.
  may(what, ns) {
    const who = this.identity;
    if (!who) return false;
    if (what === 'instances.operate') {
      if (!who.auth_enabled || !who.authenticated) return false;
      if (who.all_namespaces && who.all_namespaces.operate) return true;
      const a = who.namespaces && who.namespaces[ns];
      return !!(a && a.operate);
    }
    if (!who.auth_enabled) return true;
    if (what === 'tokens.write') return !!(who.bootstrap_tokens && who.bootstrap_tokens.write);
    return false;
  }

  // operatesAnywhere reports whether the caller may drain or deregister
  // instances in some namespace (the Services page then has an Actions
  // column).
  operatesAnywhere() {
    const who = this.identity;
    if (!who || !who.auth_enabled || !who.authenticated) return false;
    if (who.all_namespaces && who.all_namespaces.operate) return true;
    return Object.values(who.namespaces || {}).some((a) => a && a.operate);
  }

  // loadIdentity learns the server's features and the caller's identity,
  // and returns the scopes to watch.
  async loadIdentity() {
    try {
      const st = await fetchJSON('/v1/cluster');
      this.features = st.features || {};
    } catch {
      this.features = this.features || {};
    }
    this.identity = null;
    if (this.features.auth) {
      try {
        this.identity = await fetchJSON('/v1/auth/whoami');
      } catch {
        this.identity = null;
      }
    }
    this.extraDirty.add('identity');
    this.schedule();
    const who = this.identity;
    this.scopeNote = '';
    if (!who || !who.auth_enabled || !who.authenticated || (who.all_namespaces && who.all_namespaces.read)) return [''];
    const readable = Object.entries(who.namespaces || {}).filter(([, a]) => a.read).map(([ns]) => ns).sort();
    if (readable.length > MAX_STREAMS) {
      this.scopeNote = `${who.user || 'You'} may read ${readable.length} namespaces; the page follows the first ${MAX_STREAMS} (${readable.slice(0, MAX_STREAMS).join(', ')}).`;
    } else if (readable.length === 0) {
      this.scopeNote = `${who.user || 'You'} may not read any namespace of the registry: ask for a role that reads /services/<namespace>/.`;
    }
    return readable.slice(0, MAX_STREAMS);
  }

  // follow watches scopes, replacing the streams of other scopes.
  follow(scopes) {
    const key = scopes.join(',');
    if (key === this.scopesKey) return;
    this.scopesKey = key;
    for (const [sc, st] of this.streams) {
      if (!scopes.includes(sc)) {
        st.stream.stop();
        this.streams.delete(sc);
      }
    }
    this.model.watch(scopes);
    if (scopes.length !== 1 || scopes[0] !== '') this.model.system(`following namespaces ${scopes.join(', ') || '(none)'} as ${this.identity?.user || 'this user'}`);
    for (const sc of scopes) {
      if (this.streams.has(sc)) continue;
      const url = sc ? `/v1/registry/watch?namespace=${encodeURIComponent(sc)}` : '/v1/registry/watch';
      const entry = { conn: { state: 'connecting', attempt: 0 }, live: false };
      entry.stream = new Stream(url, {
        silenceMs: this.silenceMs,
        onEvent: (type, data) => this.onEvent(sc, entry, type, data),
        onState: (st) => this.onStreamState(entry, st),
      });
      this.streams.set(sc, entry);
      entry.stream.start();
    }
    this.updateConn();
  }

  async connect() {
    this.follow(await this.loadIdentity());
  }

  start() {
    document.addEventListener('click', (ev) => this.onClick(ev));
    window.addEventListener('popstate', () => this.applyRoute(false));
    document.addEventListener('keydown', (ev) => {
      if (ev.key === '/' && !isTyping(ev) && !ev.ctrlKey && !ev.metaKey && !ev.altKey) {
        const search = this.main.querySelector('[data-search]');
        if (search) {
          ev.preventDefault();
          search.focus();
          search.select();
        }
      }
    });
    this.bannerButton = h('button', {
      type: 'button', class: 'btn small', text: 'Reconnect now',
      onclick: () => {
        for (const st of this.streams.values()) st.stream.retryNow();
      },
    });
    this.bannerText = h('span', { class: 'grow' });
    // The countdown is not part of the alert: it would be read out every
    // second.
    this.bannerWait = h('span', { class: 'note', 'aria-hidden': 'true' });
    this.bannerEl.append(this.bannerText, this.bannerWait, this.bannerButton);
    this.applyRoute(false);
    this.connect();
    setInterval(() => {
      this.extraDirty.add('tick');
      this.schedule();
    }, 1000);
  }

  onClick(ev) {
    if (ev.defaultPrevented || ev.button !== 0 || ev.metaKey || ev.ctrlKey || ev.shiftKey || ev.altKey) return;
    const a = ev.target instanceof Element ? ev.target.closest('a[href]') : null;
    if (!a || a.target || a.hasAttribute('download')) return;
    const url = new URL(a.href, location.href);
    if (url.origin !== location.origin || !url.pathname.startsWith(BASE)) return;
    // In-page anchors (the skip link) keep their default: scroll and focus.
    if (url.hash && url.pathname === location.pathname) return;
    ev.preventDefault();
    this.navigate(url.pathname + url.search);
  }

  navigate(url, { replace = false } = {}) {
    if (url === location.pathname + location.search) return;
    if (replace) history.replaceState(null, '', url);
    else history.pushState(null, '', url);
    this.applyRoute(!replace);
  }

  // setParams rewrites the query string in place (filters), without a
  // history entry per keystroke.
  setParams(params) {
    const q = params.toString();
    history.replaceState(null, '', location.pathname + (q ? `?${q}` : ''));
  }

  applyRoute(userNavigation) {
    const route = parseRoute(location.pathname, location.search);
    const sectionChanged = route.section !== this.section;
    if (!sectionChanged && this.view.setRoute && this.view.setRoute(route)) {
      this.fullRender();
      return;
    }
    this.view?.unmount?.();
    this.section = route.section;
    this.view = new VIEWS[route.section](this, route);
    this.main.replaceChildren();
    this.view.mount(this.main);
    for (const a of document.querySelectorAll('.tabs a')) {
      setAttr(a, 'aria-current', a.dataset.section === route.section ? 'page' : null);
    }
    this.fullRender();
    if (userNavigation && sectionChanged) this.main.focus({ preventScroll: true });
  }

  setTitle(title) {
    document.title = title ? `${title} · Beacon` : 'Beacon';
  }

  fullRender() {
    for (const d of ['sync', 'structure', 'instances', 'events', 'history', 'conn', 'route', 'tick']) this.extraDirty.add(d);
    this.schedule();
  }

  schedule() {
    if (this.framePending) return;
    this.framePending = true;
    requestAnimationFrame(() => this.frame());
  }

  frame() {
    this.framePending = false;
    const t0 = performance.now();
    this.model.recordHistory(Date.now());
    const dirty = this.model.takeDirty();
    for (const d of this.extraDirty) dirty.add(d);
    this.extraDirty.clear();
    this.renderChrome(dirty);
    this.view?.update(dirty);
    const dt = performance.now() - t0;
    const st = this.stats;
    st.frames += 1;
    st.lastFrameMs = dt;
    if (dt > st.maxFrameMs) st.maxFrameMs = dt;
    if (dt > 16) st.frameMsOver16 += 1;
    const snap = this.pendingSnapshot;
    if (snap) {
      this.pendingSnapshot = null;
      snap.renderMs = dt;
      // The next frame starts after this one is painted.
      requestAnimationFrame(() => {
        const painted = performance.now();
        snap.toPaintMs = painted - snap.received;
        st.snapshots.push(snap);
        performance.measure('beacon:snapshot', { start: snap.received, end: painted, detail: { instances: snap.instances } });
      });
    }
  }

  onEvent(scope, entry, type, data) {
    const received = performance.now();
    this.stats.events += 1;
    let msg;
    try {
      msg = JSON.parse(data);
    } catch (err) {
      console.error('beacon: the watch stream sent malformed data', type, err);
      return;
    }
    switch (type) {
      case 'snapshot': {
        this.model.snapshot(msg, scope);
        const applied = performance.now();
        this.pendingSnapshot = { instances: (msg.instances || []).length, received, parseApplyMs: applied - received };
        break;
      }
      case 'added':
      case 'updated':
      case 'removed':
        this.model.change(type, msg);
        break;
      case 'synced':
        this.model.markSynced(msg.revision);
        break;
      case 'stale':
        entry.conn = { state: 'stale', error: msg.error || 'backend unreachable' };
        this.model.system(`the server lost its backend and retries: ${msg.error || 'unreachable'}`);
        this.updateConn();
        return;
      case 'error':
        this.model.system(`the watch stream failed: ${msg.message || 'error'}`);
        return;
      default:
        return;
    }
    if (entry.conn.state !== 'live') {
      if (entry.live && entry.conn.state !== 'stale') this.model.system(`reconnected${scope ? ` (${scope})` : ''}; up to date at revision ${num(this.model.revision)}`);
      const first = !this.everLive;
      entry.live = true;
      this.everLive = true;
      entry.conn = { state: 'live' };
      this.updateConn();
      // Signed in by the browser on the way (an authentication prompt):
      // now the server can tell who the caller is, and what it may read.
      if (first && this.features && this.features.auth && !(this.identity && this.identity.authenticated)) this.connect();
    }
  }

  onStreamState(entry, st) {
    if (st.state === 'retrying' && (entry.conn.state === 'live' || entry.conn.state === 'stale')) {
      this.model.system(`lost the watch stream: ${st.error}`);
    }
    if (st.state === 'open') return; // live once the first event arrives
    if (st.state === 'connecting' && entry.conn.state === 'retrying') {
      entry.conn = { ...entry.conn, state: 'connecting', attempt: st.attempt };
    } else {
      entry.conn = st;
    }
    this.updateConn();
  }

  // updateConn shows the worst state of the streams.
  updateConn() {
    const order = { retrying: 0, stale: 1, connecting: 2, live: 3 };
    let worst = { state: 'live' };
    for (const st of this.streams.values()) {
      if (order[st.conn.state] < order[worst.state]) worst = st.conn;
    }
    if (this.streams.size === 0) worst = { state: this.scopesKey === undefined ? 'connecting' : 'idle' };
    this.setConn(worst);
  }

  setConn(c) {
    this.conn = c;
    this.extraDirty.add('conn');
    this.schedule();
  }

  renderChrome(dirty) {
    const m = this.model;
    if (dirty.has('instances') || dirty.has('sync') || dirty.has('structure')) {
      if (m.synced) {
        const r = m.root;
        const failing = r.failing ? [h('span', { class: 'sep', text: '·' }), h('b', { class: 'bad', text: num(r.failing) }), ' failing'] : [];
        this.summaryEl.replaceChildren(
          h('b', { text: num(r.total) }), ` ${r.total === 1 ? 'instance' : 'instances'}`,
          h('span', { class: 'sep', text: '·' }),
          h('b', { text: num(r.draining) }), ' draining',
          ...failing,
          h('span', { class: 'sep', text: '·' }),
          h('b', { text: num(r.endpoints) }), ` ${r.endpoints === 1 ? 'endpoint' : 'endpoints'}`,
        );
      }
    }
    if (dirty.has('identity')) {
      const who = this.identity;
      const shown = !!(who && who.auth_enabled);
      show(this.whoEl, shown);
      if (shown) {
        const name = who.authenticated ? who.user || 'signed in' : 'not signed in';
        setText(this.whoEl, name);
        setAttr(this.whoEl, 'title', who.authenticated ? `Signed in as ${who.user || 'a token holder'} (${who.method})${who.roles && who.roles.length ? `, roles ${who.roles.join(', ')}` : ''}` : 'Not signed in: the browser asks for the etcd user and password when the API needs them');
      }
    }
    if (!(dirty.has('conn') || dirty.has('tick') || dirty.has('sync') || dirty.has('instances') || dirty.has('identity'))) return;
    const c = this.conn;
    setAttr(this.liveEl, 'data-state', c.state);
    let live = 'Connecting…';
    let banner = '';
    const wait = c.retryAt ? Math.max(0, Math.ceil((c.retryAt - Date.now()) / 1000)) : 0;
    const at = m.synced ? ` The page shows the registry as of revision ${num(m.revision)}, which may be out of date.` : '';
    switch (c.state) {
      case 'live':
        live = `Live · rev ${num(m.revision)}`;
        break;
      case 'stale':
        live = 'Backend unreachable';
        banner = `The server lost its connection to the registry backend (${c.error}) and is retrying.${at}`;
        break;
      case 'retrying':
        live = wait > 0 ? `Reconnecting in ${wait} s` : 'Reconnecting…';
        banner = `Lost the live event stream: ${c.error}. Reconnecting automatically.${at}`;
        break;
      case 'connecting':
        if (this.everLive || c.attempt > 0) {
          live = 'Reconnecting…';
          banner = `Reconnecting to the live event stream…${at}`;
        }
        break;
      case 'idle':
        live = 'Nothing to watch';
        break;
      default:
        break;
    }
    if (!banner && this.scopeNote) banner = this.scopeNote;
    setText(this.liveText, live);
    setAttr(this.liveEl, 'title', live);
    setText(this.bannerText, banner);
    setText(this.bannerWait, c.state === 'retrying' && wait > 0 ? `next attempt in ${plural(wait, 'second')}` : '');
    show(this.bannerButton, c.state === 'retrying');
    show(this.bannerEl, banner !== '');
  }
}

const app = new App();
// Diagnostics for operators and tests (see docs/dashboard.md).
window.beacon = { stats: app.stats, model: app.model };
app.start();
