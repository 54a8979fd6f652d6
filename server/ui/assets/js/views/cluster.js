// Cluster: the backend under the registry. With etcd, its members (name,
// ID, URLs, leader, raft term and index, DB size, revision, health); with
// another backend, that backend's health; and the registry session. The
// API has no stream of member status, so the page re-reads /v1/cluster
// every few seconds while it is shown.

import { h } from '../dom.js';
import { bytes, clock, num, plural } from '../format.js';
import { Poller, card, fetchJSON } from './common.js';

const REFRESH_MS = 5000;

export class ClusterView {
  constructor(app) {
    this.app = app;
  }

  mount(main) {
    this.app.setTitle('Cluster');
    this.note = h('span', { class: 'note', text: 'Loading…' });
    this.body = h('div', { class: 'page-body' });
    this.el = h('div', { class: 'page scroll', 'aria-busy': 'true' },
      h('div', { class: 'section-head' }, h('h1', { text: 'Cluster' }), this.note), this.body);
    main.append(this.el);
    this.poller = new Poller(() => this.refresh(), REFRESH_MS);
    this.poller.kick();
  }

  unmount() {
    this.poller.stop();
  }

  update() {}

  async refresh() {
    let st;
    try {
      st = await fetchJSON('/v1/cluster');
    } catch (err) {
      this.note.textContent = `Could not read /v1/cluster at ${clock(Date.now())}; retrying every ${REFRESH_MS / 1000} s.`;
      this.body.replaceChildren(h('div', { class: 'error-box', role: 'alert', text: `The server did not answer: ${err.message}` }));
      this.el.removeAttribute('aria-busy');
      return;
    }
    this.note.textContent = `Refreshed ${clock(Date.now())} (every ${REFRESH_MS / 1000} s)`;
    this.el.removeAttribute('aria-busy');
    this.body.replaceChildren(...this.render(st));
  }

  render(st) {
    const health = st.health || {};
    const ok = health.status === 'ok';
    const out = [];
    const cards = [
      card('Backend', h('div', { class: 'value', text: st.backend || '–' })),
      card('Where', h('div', { class: 'mono', text: st.description || '–' })),
      card('Backend health', h('div', {},
        h('span', { class: `badge ${ok ? 'ok' : 'bad'}`, text: ok ? 'healthy' : 'unavailable' }),
        ' ',
        h('span', { class: 'note', text: ok ? `read in ${(health.latency_ms || 0).toFixed(1)} ms` : health.error || '' }))),
    ];
    if (st.session) {
      const s = st.session;
      const good = s.state === 'active' || s.state === 'recovered' || s.state === 'idle';
      cards.push(card('Registry session', h('div', {},
        h('span', { class: `badge ${good ? 'ok' : 'warn'}`, text: s.state }),
        ' ',
        h('span', { class: 'note', text: s.lease_ttl_seconds ? `lease TTL ${s.lease_ttl_seconds} s` : '' }))));
    }
    const etcd = st.etcd;
    if (etcd && etcd.members) {
      const healthy = etcd.members.filter((m) => m.healthy).length;
      const leader = etcd.members.find((m) => m.leader);
      cards.push(card('etcd members', h('div', { class: 'value' }, `${healthy}`, h('span', { class: 'note', text: ` of ${num(etcd.members.length)} healthy` }))));
      cards.push(card('Leader', h('div', { class: 'mono', text: leader ? `${leader.name || leader.id}` : 'none known' })));
    }
    out.push(h('div', { class: 'cards' }, cards));
    if (etcd) {
      if (etcd.error) out.push(h('div', { class: 'error-box', role: 'alert', text: `Listing the etcd members failed: ${etcd.error}` }));
      if (etcd.members && etcd.members.length) out.push(this.membersTable(etcd));
    } else {
      out.push(h('p', { class: 'note', text: `The registry runs on the ${st.backend} backend: there are no etcd members to show. Its health above is a read of the store.` }));
    }
    return out;
  }

  membersTable(etcd) {
    const cols = ['Name', 'Member ID', 'Role', 'Health', 'Raft term', 'Raft index', 'Revision', 'DB size (in use)', 'Version', 'Peer URLs', 'Client URLs'];
    const num_ = new Set(['Raft term', 'Raft index', 'Revision', 'DB size (in use)']);
    const rows = etcd.members.map((m) => {
      const role = m.learner ? 'learner' : m.leader ? 'leader' : 'follower';
      return h('tr', {},
        h('td', { text: m.name || '(not started)' }),
        h('td', { class: 'mono', text: m.id }),
        h('td', {}, h('span', { class: `badge ${m.leader ? 'info' : 'muted'}`, text: role })),
        h('td', {}, h('span', { class: `badge ${m.healthy ? 'ok' : 'bad'}`, text: m.healthy ? 'healthy' : 'unhealthy' }),
          m.healthy ? null : h('div', { class: 'note bad', text: m.health })),
        h('td', { class: 'num', text: m.raft_term ? num(m.raft_term) : '–' }),
        h('td', { class: 'num', text: m.raft_index ? num(m.raft_index) : '–' }),
        h('td', { class: 'num', text: m.revision ? num(m.revision) : '–' }),
        h('td', { class: 'num', text: m.db_size_bytes ? `${bytes(m.db_size_bytes)} (${bytes(m.db_size_in_use_bytes)})` : '–' }),
        h('td', { text: m.version || '–' }),
        h('td', { class: 'mono', text: (m.peer_urls || []).join(', ') }),
        h('td', { class: 'mono', text: (m.client_urls || []).join(', ') || '–' }));
    });
    return h('table', { class: 'data' },
      h('caption', { text: `etcd members (${plural(etcd.members.length, 'member')}${etcd.cluster_id ? `, cluster ${etcd.cluster_id}` : ''})` }),
      h('thead', {}, h('tr', {}, cols.map((c) => h('th', { scope: 'col', class: num_.has(c) ? 'num' : null, text: c })))),
      h('tbody', {}, rows));
  }
}
