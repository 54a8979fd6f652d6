// Events: a timeline of joins, updates, drains, failing health checks and
// leaves, newest first, as the page saw them on the watch stream.

import { h, setAttr, setText, show, uid } from '../dom.js';
import { clock, num, plural, visible } from '../format.js';
import { MAX_EVENTS } from '../model.js';
import { Grid } from '../vrows.js';
import { servicesURL } from '../router.js';

const ROW = 30;
const GROUPS = [
  { id: 'join', label: 'Joined', kinds: ['join'] },
  { id: 'update', label: 'Updated', kinds: ['update'] },
  { id: 'drain', label: 'Draining', kinds: ['drain', 'undrain'] },
  { id: 'health', label: 'Health', kinds: ['fail', 'recover'] },
  { id: 'leave', label: 'Left', kinds: ['leave'] },
  { id: 'system', label: 'Stream', kinds: ['system'] },
];
const LABEL = {
  join: 'joined', update: 'updated', drain: 'draining', undrain: 'serving again', fail: 'failing', recover: 'routed again', leave: 'left', system: 'stream',
};
const COLUMNS = [
  { id: 'time', title: 'Time', cls: 'mono muted' },
  { id: 'kind', title: 'Event', badge: true },
  { id: 'service', title: 'Service', cls: 'mono' },
  { id: 'id', title: 'Instance', cls: 'mono' },
  { id: 'address', title: 'Address', cls: 'mono', tip: true },
  { id: 'detail', title: 'Detail', cls: 'muted', tip: true },
  { id: 'rev', title: 'Revision', cls: 'num mono' },
];

export class EventsView {
  constructor(app, route) {
    this.app = app;
    this.model = app.model;
    const kinds = route.params.get('kinds');
    this.groups = new Set(kinds ? kinds.split(',').filter((k) => GROUPS.some((g) => g.id === k)) : GROUPS.map((g) => g.id));
    this.text = route.params.get('q') || '';
    this.filtered = [];
    this.lastSeq = 0;
    this.rebuild = true;
  }

  mount(main) {
    this.app.setTitle('Events');
    const filterId = uid('ev-filter');
    this.toggles = GROUPS.map((g) => h('button', {
      type: 'button', class: 'btn small toggle', 'aria-pressed': String(this.groups.has(g.id)), text: g.label,
      onclick: (ev) => {
        if (this.groups.has(g.id)) this.groups.delete(g.id);
        else this.groups.add(g.id);
        ev.currentTarget.setAttribute('aria-pressed', String(this.groups.has(g.id)));
        this.changed();
      },
    }));
    this.input = h('input', {
      id: filterId, type: 'search', placeholder: 'Service, ID, address, detail…', autocomplete: 'off', spellcheck: 'false', 'data-search': '',
      oninput: () => {
        this.text = this.input.value;
        this.changed();
      },
    });
    this.input.value = this.text;
    this.countEl = h('span', { class: 'count' });
    this.grid = new Grid({
      label: 'Events, newest first',
      idPrefix: uid('ev'),
      columns: COLUMNS,
      layout: 'events',
      rowHeight: ROW,
      cellText: (i, col) => this.cellText(i, col),
      badgeClass: (i) => this.entry(i).kind,
      onActivate: (i) => {
        const e = this.entry(i);
        if (e.inst) this.app.navigate(servicesURL([e.inst.namespace, e.inst.component, e.inst.endpoint], e.inst.id));
      },
    });
    this.empty = h('div', { class: 'empty', hidden: true });
    this.el = h('div', { class: 'page' },
      h('div', { class: 'section-head' }, h('h1', { text: 'Events' }),
        h('span', { class: 'note', text: `Newest first; the page keeps the last ${num(MAX_EVENTS)} events it saw since it opened.` })),
      h('div', { class: 'toolbar' },
        h('div', { role: 'group', 'aria-label': 'Event kinds shown' }, this.toggles),
        h('label', { class: 'field', for: filterId, text: 'Filter' }), this.input, this.countEl),
      this.grid.el, this.empty);
    main.append(this.el);
  }

  unmount() {
    this.grid.rows.destroy();
  }

  changed() {
    const p = new URLSearchParams();
    if (this.text) p.set('q', this.text);
    if (this.groups.size !== GROUPS.length) p.set('kinds', [...this.groups].join(','));
    this.app.setParams(p);
    this.rebuild = true;
    this.app.schedule();
  }

  entry(i) {
    return this.filtered[this.filtered.length - 1 - i];
  }

  matches(e, kinds, f) {
    if (!kinds.has(e.kind)) return false;
    if (!f) return true;
    if (e.search === undefined) {
      const inst = e.inst;
      e.search = `${e.key || ''} ${inst ? inst.address : ''} ${e.detail || ''} ${LABEL[e.kind]} ${e.rev}`.toLowerCase();
    }
    return e.search.includes(f);
  }

  cellText(i, col) {
    const e = this.entry(i);
    const inst = e.inst;
    switch (col) {
      case 'time':
        return clock(e.t);
      case 'kind':
        return LABEL[e.kind];
      case 'service':
        return inst ? `${inst.namespace}/${inst.component}/${inst.endpoint}` : '–';
      case 'id':
        return inst ? inst.id : '';
      case 'address':
        return inst ? visible(inst.address) : '';
      case 'detail':
        return visible(e.batch === 'resync' ? `${e.detail ? `${e.detail}; ` : ''}found by re-listing after a reconnect` : e.detail);
      case 'rev':
        return e.rev ? num(e.rev) : '';
      default:
        return '';
    }
  }

  update(dirty) {
    const events = this.model.events;
    const kinds = new Set(GROUPS.filter((g) => this.groups.has(g.id)).flatMap((g) => g.kinds));
    const f = this.text.trim().toLowerCase();
    let added = 0;
    if (this.rebuild || dirty.has('events-trimmed')) {
      this.rebuild = false;
      this.filtered = events.filter((e) => this.matches(e, kinds, f));
      this.lastSeq = events.length ? events[events.length - 1].seq : 0;
      this.grid.setCount(this.filtered.length);
      this.grid.active = -1;
      this.grid.rows.scrollTo(0);
    } else if (events.length && events[events.length - 1].seq > this.lastSeq) {
      // Only the new events: find where they start (seqs are ascending).
      let i = events.length - 1;
      while (i > 0 && events[i - 1].seq > this.lastSeq) i -= 1;
      for (; i < events.length; i += 1) {
        if (this.matches(events[i], kinds, f)) {
          this.filtered.push(events[i]);
          added += 1;
        }
      }
      this.lastSeq = events[events.length - 1].seq;
      if (added) {
        this.grid.setCount(this.filtered.length);
        // Keep what the reader looks at in place when scrolled down.
        if (this.grid.rows.top > 0) this.grid.rows.scrollTo(this.grid.rows.top + added * ROW);
        if (this.grid.active >= 0) this.grid.active += added;
      }
    }
    const total = events.length;
    setText(this.countEl, this.filtered.length === total ? plural(total, 'event') : `${num(this.filtered.length)} of ${plural(total, 'event')}`);
    const none = this.filtered.length === 0;
    if (none) {
      const msg = total === 0
        ? 'No events yet. Joins, updates, drains and leaves appear here as they happen, newest first, each with the store revision of the change.'
        : 'No event matches the filter.';
      if (this.empty.__msg !== msg) {
        this.empty.__msg = msg;
        this.empty.replaceChildren(h('p', { text: msg }));
      }
    }
    show(this.empty, none);
    setAttr(this.grid.el, 'aria-busy', this.model.synced ? null : 'true');
    this.grid.refresh();
  }
}
