// Pieces shared by the views.

import { h } from '../dom.js';

// registerHelp tells how to register an instance, for the empty states.
export function registerHelp(path) {
  const [ns = 'demo', comp = 'web', ep = 'http'] = path || [];
  const body = JSON.stringify({ namespace: ns, component: comp, endpoint: ep, address: '127.0.0.1:8080', ttl: '10s' });
  return [
    h('p', { text: 'Register one from a worker process with the CLI (Ctrl-C deregisters it; a crash lets its lease expire):' }),
    h('pre', { text: `beacon register ${ns}/${comp}/${ep} --addr 127.0.0.1:8080 --meta zone=a` }),
    h('p', {}, 'or over the HTTP API (heartbeat within the TTL to keep it), or from Go with ', h('code', { text: 'registry.Register' }), ':'),
    h('pre', { text: `curl -XPOST ${location.origin}/v1/registry/instances -H 'Content-Type: application/json' \\\n  -d '${body}'` }),
    h('p', { text: 'It appears here within a second, without reloading the page.' }),
  ];
}

export function card(label, valueEl, cls) {
  return h('div', { class: `card ${cls || ''}` }, h('div', { class: 'label', text: label }), valueEl);
}

// fetchJSON GETs a JSON document with a timeout; errors carry the API's
// message.
export async function fetchJSON(url, { timeoutMs = 8000, signal, method = 'GET' } = {}) {
  const ctrl = new AbortController();
  const timer = setTimeout(() => ctrl.abort(new Error(`no answer from ${url} within ${timeoutMs / 1000} s`)), timeoutMs);
  const onAbort = () => ctrl.abort(signal.reason);
  signal?.addEventListener('abort', onAbort);
  try {
    const resp = await fetch(url, { method, signal: ctrl.signal, headers: { Accept: 'application/json' }, cache: 'no-store' });
    let body = null;
    try {
      body = await resp.json();
    } catch {
      body = null;
    }
    if (!resp.ok) {
      const err = new Error(body && body.message ? body.message : `HTTP ${resp.status}`);
      err.status = resp.status;
      err.code = body && body.code;
      throw err;
    }
    return body;
  } catch (err) {
    if (ctrl.signal.aborted && ctrl.signal.reason) throw ctrl.signal.reason;
    throw err;
  } finally {
    clearTimeout(timer);
    signal?.removeEventListener('abort', onAbort);
  }
}

// Poller runs fn now and then every intervalMs while the page is visible,
// never two at once. It is for data the API offers no stream of (cluster
// members, bootstrap tokens).
export class Poller {
  constructor(fn, intervalMs) {
    this.fn = fn;
    this.intervalMs = intervalMs;
    this.timer = 0;
    this.stopped = false;
    this.running = false;
    this.onVisible = () => {
      if (document.visibilityState === 'visible') this.kick();
    };
    document.addEventListener('visibilitychange', this.onVisible);
  }

  kick() {
    if (this.stopped || this.running) return;
    clearTimeout(this.timer);
    this.running = true;
    Promise.resolve()
      .then(() => this.fn())
      .catch((err) => console.warn('beacon: refresh failed', err))
      .finally(() => {
        this.running = false;
        if (!this.stopped && document.visibilityState === 'visible') this.timer = setTimeout(() => this.kick(), this.intervalMs);
      });
  }

  stop() {
    this.stopped = true;
    clearTimeout(this.timer);
    document.removeEventListener('visibilitychange', this.onVisible);
  }
}
