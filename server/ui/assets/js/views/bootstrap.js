// Bootstrap: etcd v3 discovery tokens, so that a person can watch a
// cluster form: each token's size and the members registered so far. The
// token API has no stream, so the page re-reads the token every couple of
// seconds while it is shown.

import { h, show, uid } from '../dom.js';
import { age, clock, dateTime, num, visible } from '../format.js';
import { BASE } from '../router.js';
import { Poller, card, fetchJSON } from './common.js';

const WAITING_MS = 2000;
const FULL_MS = 10000;

export class BootstrapView {
  constructor(app, route) {
    this.app = app;
    this.token = route.token;
  }

  setRoute(route) {
    if (route.section !== 'bootstrap' || route.token === this.token) return route.section === 'bootstrap';
    return false;
  }

  mount(main) {
    this.app.setTitle(this.token ? `Token ${this.token}` : 'Bootstrap');
    const inputId = uid('token');
    this.input = h('input', { id: inputId, type: 'text', name: 'token', autocomplete: 'off', spellcheck: 'false', placeholder: 'token from beacon token new', required: true, 'data-search': '' });
    this.input.value = this.token;
    const form = h('form', {
      class: 'inline', role: 'search', 'aria-label': 'Watch a discovery token',
      onsubmit: (ev) => {
        ev.preventDefault();
        const t = this.input.value.trim();
        if (t) this.app.navigate(`${BASE}bootstrap/${encodeURIComponent(t)}`);
      },
    }, h('label', { class: 'field', for: inputId, text: 'Discovery token' }), this.input, h('button', { type: 'submit', class: 'btn primary', text: 'Watch' }));
    this.note = h('span', { class: 'note' });
    this.list = h('div');
    this.body = h('div', { class: 'page-body' });
    // Actions live outside the body that each refresh rewrites.
    this.actions = h('div', { class: 'actions', hidden: true });
    this.el = h('div', { class: 'page scroll' },
      h('div', { class: 'section-head' }, h('h1', { text: this.token ? 'Bootstrap token' : 'Bootstrap' }), this.note),
      h('p', { class: 'note' }, 'Members of a new etcd cluster (etcd 3.6+ or ', h('code', { text: 'beacon serve' }),
        ') find each other through a discovery token: each registers under it, and the cluster forms once the token\'s size is reached. Create one with ',
        h('code', { text: 'beacon token new --size 3' }), '.'),
      form, this.list, this.actions, this.body);
    main.append(this.el);
    this.poller = new Poller(() => this.refresh(), WAITING_MS);
    this.poller.kick();
  }

  unmount() {
    this.poller.stop();
  }

  update(dirty) {
    if (dirty.has('identity') || dirty.has('route')) this.renderActions();
  }

  // renderActions offers to remove the token when the HTTP API allows the
  // caller to (whoami); the API decides in the end.
  renderActions() {
    const may = this.token && this.found && this.app.may('tokens.write');
    if (!may) {
      this.actions.replaceChildren();
      show(this.actions, false);
      return;
    }
    if (this.actions.__for === this.token && this.actions.childElementCount) {
      show(this.actions, true);
      return;
    }
    this.actions.__for = this.token;
    const remove = h('button', {
      type: 'button', class: 'btn danger', text: 'Remove token…',
      onclick: () => this.confirmRemove(),
    });
    this.actions.replaceChildren(remove);
    show(this.actions, true);
  }

  confirmRemove() {
    const token = this.token;
    const msg = h('span', { text: `Remove token ${token} and its registrations? Members still waiting on it will fail to bootstrap.` });
    const yes = h('button', { type: 'button', class: 'btn danger', text: 'Remove' });
    const no = h('button', {
      type: 'button', class: 'btn', text: 'Cancel',
      onclick: () => {
        this.actions.__for = '';
        this.renderActions();
      },
    });
    const result = h('span', { class: 'note', role: 'status' });
    yes.addEventListener('click', async () => {
      yes.disabled = true;
      no.disabled = true;
      try {
        const res = await fetchJSON(`/v1/tokens/${encodeURIComponent(token)}`, { method: 'DELETE' });
        this.app.removedToken = `Removed token ${token} (${res.deleted} key${res.deleted === 1 ? '' : 's'}).`;
        this.app.navigate(`${BASE}bootstrap`);
      } catch (err) {
        result.textContent = `The server refused: ${err.message}`;
        result.className = 'note bad';
        no.disabled = false;
      }
    });
    this.actions.replaceChildren(h('div', { class: 'confirm', role: 'group', 'aria-label': 'Confirm removal' }, msg, yes, no, result));
    yes.focus();
  }

  async refresh() {
    if (!this.features) {
      try {
        const st = await fetchJSON('/v1/cluster');
        this.features = st.features || {};
        this.backend = st.backend;
      } catch (err) {
        this.body.replaceChildren(h('div', { class: 'error-box', role: 'alert', text: `The server did not answer: ${err.message}` }));
        return;
      }
    }
    if (!this.features.discovery_tokens) {
      this.poller.stop();
      this.body.replaceChildren(h('div', { class: 'empty' },
        h('h2', { text: 'No discovery tokens on this server' }),
        h('p', { text: `Discovery tokens are kept in etcd, and this server's registry runs on the ${this.backend} backend. Run beacon serve with embedded etcd (the default) or --etcd-endpoints to use them.` })));
      return;
    }
    await this.refreshList();
    if (!this.token && this.app.removedToken) {
      this.body.replaceChildren(h('p', { class: 'note', role: 'status', text: this.app.removedToken }));
      this.app.removedToken = '';
    }
    if (!this.token) {
      this.poller.intervalMs = FULL_MS;
      return;
    }
    let st;
    try {
      st = await fetchJSON(`/v1/tokens/${encodeURIComponent(this.token)}`);
    } catch (err) {
      this.note.textContent = `Checked ${clock(Date.now())}`;
      const msg = err.status === 404 ? `There is no token “${this.token}” (it was never created, or it was removed).` : err.message;
      this.body.replaceChildren(h('div', { class: 'error-box', role: 'alert', text: msg }));
      this.found = false;
      this.renderActions();
      return;
    }
    this.found = true;
    this.renderActions();
    const full = st.state === 'full';
    this.poller.intervalMs = full ? FULL_MS : WAITING_MS;
    this.note.textContent = `Refreshed ${clock(Date.now())} (every ${(full ? FULL_MS : WAITING_MS) / 1000} s)`;
    this.body.replaceChildren(...this.render(st));
  }

  // refreshList shows every token when the server can list them (GET
  // /v1/tokens, features.token_list); other servers show the form only.
  async refreshList() {
    if (this.noList || !this.features.token_list) return;
    let res;
    try {
      res = await fetchJSON('/v1/tokens');
    } catch (err) {
      if (err.status === 404 || err.status === 405) {
        this.noList = true;
        return;
      }
      this.list.replaceChildren(h('p', { class: 'note bad', text: `Listing tokens failed: ${err.message}` }));
      return;
    }
    const tokens = res && Array.isArray(res.tokens) ? res.tokens : [];
    if (tokens.length === 0) {
      this.list.replaceChildren(h('p', { class: 'note', text: 'No discovery tokens yet.' }));
      return;
    }
    // Newest first: a person watching a cluster form just made its token.
    const rows = [...tokens].reverse().map((t) => {
      // A full token whose members cannot form a cluster (two share a
      // name, ...) has a problem too: not a plain "full".
      const state = t.problem ? (t.full ? 'full: cannot form' : 'problem') : t.full ? 'full' : 'waiting';
      const created = t.created_at ? Date.parse(t.created_at) : 0;
      return h('tr', {},
        h('td', { class: 'mono' }, h('a', { href: `${BASE}bootstrap/${encodeURIComponent(t.token)}`, text: t.token })),
        h('td', { class: 'num', text: t.size ? num(t.size) : '–' }),
        h('td', { class: 'num', text: num(t.registered || 0) }),
        h('td', {}, h('span', { class: `badge ${t.problem ? 'bad' : state}`, text: state }), t.problem ? h('div', { class: 'note bad', text: t.problem }) : null),
        h('td', { class: 'num', text: t.members > (t.registered || 0) ? `${num(t.members - t.registered)} late` : '' }),
        h('td', { text: created ? `${dateTime(created)} (${age(Date.now() - created)} ago)` : `revision ${num(t.created_revision || 0)}` }));
    });
    const cols = ['Token', 'Size', 'Registered', 'State', 'Too late', 'Created'];
    this.list.replaceChildren(h('table', { class: 'data' },
      h('caption', { text: `Discovery tokens (${num(tokens.length)})` }),
      h('thead', {}, h('tr', {}, cols.map((c, i) => h('th', { scope: 'col', class: i === 1 || i === 2 || i === 4 ? 'num' : null, text: c })))),
      h('tbody', {}, rows)));
  }

  render(st) {
    const full = st.state === 'full';
    const size = st.size || 0;
    const members = st.members || [];
    const bar = h('div', { class: `progress ${full ? 'full' : ''}`, role: 'progressbar', 'aria-label': 'Members registered', 'aria-valuemin': '0', 'aria-valuemax': String(size), 'aria-valuenow': String(st.registered) });
    const fill = h('div');
    fill.style.width = `${size ? (100 * st.registered) / size : 0}%`;
    bar.append(fill);
    const out = [
      h('h2', { class: 'mono', text: st.token }),
      h('div', { class: 'cards' },
        card('State', h('div', {}, h('span', { class: `badge ${full ? 'full' : 'waiting'}`, text: full ? 'full: the cluster can form' : 'waiting for members' }))),
        card('Registered', h('div', {}, h('div', { class: 'value', text: `${num(st.registered)} of ${num(size)}` }), bar)),
        card('Revision', h('div', { class: 'value', text: num(st.revision || 0) }))),
    ];
    if (members.length === 0) {
      out.push(h('div', { class: 'empty' }, h('p', { text: 'No member has registered yet. Start each member with the flags beacon token new printed (--discovery-token and --discovery-endpoints); they appear here as they register.' })));
    } else {
      out.push(h('table', { class: 'data' },
        h('caption', { text: 'Members, in registration order' }),
        h('thead', {}, h('tr', {}, ['#', 'Name', 'Member ID', 'Peer URLs', 'Registered at revision', ''].map((c, i) => h('th', { scope: 'col', class: i === 0 || i === 4 ? 'num' : null, text: c })))),
        h('tbody', {}, members.map((m, i) => h('tr', {},
          h('td', { class: 'num', text: String(i + 1) }),
          h('td', { text: visible(m.name) }),
          h('td', { class: 'mono', text: m.id }),
          h('td', { class: 'mono', text: visible((m.peer_urls || []).join(', ')) }),
          h('td', { class: 'num', text: num(m.create_revision) }),
          h('td', {}, h('span', { class: `badge ${i < size ? 'ok' : 'warn'}`, text: i < size ? 'in the cluster' : 'too late: cluster full' })))))));
    }
    if (st.skipped && st.skipped.length) {
      out.push(h('table', { class: 'data' },
        h('caption', { text: 'Entries etcd ignores too' }),
        h('thead', {}, h('tr', {}, ['Key', 'Value', 'Why'].map((c) => h('th', { scope: 'col', text: c })))),
        h('tbody', {}, st.skipped.map((s) => h('tr', {}, h('td', { class: 'mono', text: visible(s.key) }), h('td', { class: 'mono', text: visible(s.value) }), h('td', { text: s.reason }))))));
    }
    if (st.initial_cluster) {
      out.push(h('div', {}, h('h3', { text: 'Initial cluster' }), h('pre', { class: 'mono', text: st.initial_cluster })));
    }
    return out;
  }
}
