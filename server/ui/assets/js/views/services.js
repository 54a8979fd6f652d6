// Services: the namespace → component → endpoint tree with counts, and the
// instances under the selected node.

import { append, h, setAttr, setClass, setText, show, uid } from '../dom.js';
import { age, clock, dateTime, num, plural, visible } from '../format.js';
import { HEALTH_TEXT, HISTORY_MS } from '../model.js';
import { Grid, VirtualRows } from '../vrows.js';
import { Sparkline } from '../sparkline.js';
import { BASE, servicesURL } from '../router.js';
import { card, fetchJSON, registerHelp } from './common.js';

const KIND = ['', 'namespace', 'component', 'endpoint'];
const ROW = 30;
// Above this many endpoints, components start collapsed.
const MANY_ENDPOINTS = 300;

const ALL_COLUMNS = [
  { id: 'service', title: 'Service', sortable: true, cls: 'mono' },
  { id: 'id', title: 'Instance', sortable: true, cls: 'mono' },
  { id: 'address', title: 'Address', sortable: true, cls: 'mono', tip: true },
  { id: 'transport', title: 'Transport', sortable: true },
  { id: 'status', title: 'Status', sortable: true, badge: true },
  { id: 'health', title: 'Health', sortable: true, badge: true },
  { id: 'meta', title: 'Metadata', cls: 'meta', tip: true },
  { id: 'age', title: 'Age', sortable: true, cls: 'num' },
];

// HEALTH_BADGE is the badge class of each healthOf value; HEALTH_RANK
// sorts the instances out of routing first.
const HEALTH_BADGE = { '': 'none', unknown: 'muted', passing: 'ok', failing: 'bad', panic: 'warn' };
const HEALTH_RANK = { failing: 0, panic: 1, unknown: 2, passing: 3, '': 4 };

// checkText describes a declared check: "http /healthz every 5s".
function checkText(c) {
  const what = c.kind === 'http' ? `http ${c.path}` : c.kind === 'grpc' && c.service ? `grpc ${c.service}` : c.kind === 'ttl' ? `ttl ${c.ttl}` : c.kind;
  const opts = [c.timeout && `timeout ${c.timeout}`, c.rise && `rise ${c.rise}`, c.fall && `fall ${c.fall}`].filter(Boolean);
  return `${visible(what)} every ${c.interval || '10s'}${opts.length ? ` (${opts.join(', ')})` : ''}`;
}

function instanceName(inst) {
  return `${inst.namespace}/${inst.component}/${inst.endpoint}/${inst.id}`;
}

function cmp(a, b) {
  return a < b ? -1 : a > b ? 1 : 0;
}

const SORTS = {
  service: (a, b) => cmp(a.key, b.key),
  id: (a, b) => cmp(a.inst.id, b.inst.id) || cmp(a.key, b.key),
  address: (a, b) => cmp(a.addrKey, b.addrKey) || cmp(a.key, b.key),
  transport: (a, b) => cmp(a.inst.transport || '', b.inst.transport || '') || cmp(a.key, b.key),
  status: (a, b) => cmp(a.draining, b.draining) || cmp(a.addrKey, b.addrKey) || cmp(a.key, b.key),
  health: (a, b) => HEALTH_RANK[a.health] - HEALTH_RANK[b.health] || cmp(a.addrKey, b.addrKey) || cmp(a.key, b.key),
  // Ascending age: the youngest registration first.
  age: (a, b) => b.registeredMs - a.registeredMs || cmp(a.key, b.key),
};

export class ServicesView {
  constructor(app, route) {
    this.app = app;
    this.model = app.model;
    this.expanded = new Set();
    this.collapsed = new Set();
    this.flat = [];
    this.treeActive = -1;
    this.treeDirty = true;
    this.treeFilter = route.params.get('q') || '';
    this.statusFilter = ['draining', 'failing'].includes(route.params.get('status')) ? route.params.get('status') : '';
    this.instFilter = route.params.get('filter') || '';
    this.sort = { col: 'address', dir: 1 };
    this.list = [];
    this.listKey = '';
    this.inspectKey = '';
    this.inspected = null;
    // Operator actions (drain, deregister) are offered only where the
    // server says the caller may (whoami); the API decides in the end.
    this.ops = app.operatesAnywhere();
    this.actionsColumn = {
      id: 'actions', title: 'Actions', cls: 'ops',
      create: (cell) => this.createActions(cell),
      render: (cell, i) => this.renderActions(cell, i),
    };
    this.setRoute(route);
  }

  setRoute(route) {
    if (route.section !== 'services') return false;
    const changed = this.path === undefined || this.path.join('/') !== route.path.join('/');
    this.path = route.path;
    this.inspectKey = route.id ? `${route.path.join('/')}/${route.id}` : changed ? '' : this.inspectKey;
    for (let i = 1; i < this.path.length; i += 1) {
      const k = this.path.slice(0, i).join('/');
      this.expanded.add(k);
      this.collapsed.delete(k);
    }
    this.treeDirty = true;
    this.listKey = '';
    if (changed && this.grid) {
      this.grid.active = -1;
      this.grid.rows.scrollTo(0);
      this.buildColumns();
    }
    return true;
  }

  mount(main) {
    const treeFilterId = uid('tree-filter');
    this.treeInput = h('input', {
      id: treeFilterId, type: 'search', placeholder: 'Filter services  ( / )', autocomplete: 'off', spellcheck: 'false', 'data-search': '',
      oninput: () => {
        this.treeFilter = this.treeInput.value;
        this.saveParams();
        this.treeDirty = true;
        this.app.schedule();
      },
    });
    this.treeInput.value = this.treeFilter;
    this.statusSelect = h('select', {
      'aria-label': 'Which services to show',
      onchange: () => {
        this.statusFilter = this.statusSelect.value;
        this.saveParams();
        this.treeDirty = true;
        this.app.schedule();
      },
    }, h('option', { value: '', text: 'All services' }), h('option', { value: 'draining', text: 'With draining instances' }),
    h('option', { value: 'failing', text: 'With failing instances' }));
    this.statusSelect.value = this.statusFilter;
    this.rootLink = h('a', { class: 'tree-root', href: BASE + 'services' }, h('span', { class: 'name', text: 'All services' }));
    this.rootCount = h('span', { class: 'n' });
    this.rootLink.append(' ', this.rootCount);
    this.treeId = uid('tree');
    this.tree = h('div', { class: 'tree', role: 'tree', tabindex: '0', 'aria-label': 'Services' });
    this.treeRows = new VirtualRows({
      scroller: this.tree,
      rowHeight: ROW,
      createRow: () => this.createTreeRow(),
      updateRow: (el, i) => this.updateTreeRow(el, i),
    });
    this.tree.addEventListener('keydown', (ev) => this.onTreeKey(ev));
    this.tree.addEventListener('click', (ev) => this.onTreeClick(ev));
    this.tree.addEventListener('focus', () => {
      if (this.treeActive < 0 && this.flat.length) this.treeActive = Math.max(0, this.selectedIndex());
      this.refreshTree();
    });
    this.tree.addEventListener('blur', () => this.refreshTree());
    this.treeEmpty = h('p', { class: 'side-empty', hidden: true });
    const side = h('aside', { class: 'side', 'aria-label': 'Service tree' },
      h('div', { class: 'side-tools' },
        h('label', { class: 'visually-hidden', for: treeFilterId, text: 'Filter services by name' }),
        this.treeInput,
        h('div', { class: 'row' }, this.statusSelect)),
      this.rootLink,
      this.tree,
      this.treeEmpty);

    this.crumbs = h('ol', { class: 'crumbs' });
    this.titleId = uid('title');
    this.title = h('h1', { id: this.titleId });
    this.kindEl = h('span', { class: 'kind' });
    this.nTotal = h('div', { class: 'value' });
    this.nServing = h('div', { class: 'value ok' });
    this.nDraining = h('div', { class: 'value warn' });
    this.nFailing = h('div', { class: 'value failing' }); // red while any fails
    this.nEndpoints = h('div', { class: 'value' });
    this.endpointsCard = card('Endpoints', this.nEndpoints);
    this.spark = new Sparkline();
    this.sparkNow = h('span');
    this.sparkLabel = h('span');
    this.stats = h('div', { class: 'stats' },
      card('Instances', this.nTotal),
      card('Serving', this.nServing),
      card('Draining', this.nDraining),
      card('Failing', this.nFailing),
      this.endpointsCard,
      h('div', { class: 'card spark' }, h('div', { class: 'head' }, this.sparkLabel, this.sparkNow), this.spark.el));

    const instFilterId = uid('inst-filter');
    this.instInput = h('input', {
      id: instFilterId, type: 'search', placeholder: 'Address, ID, status, metadata…', autocomplete: 'off', spellcheck: 'false',
      oninput: () => {
        this.instFilter = this.instInput.value;
        this.saveParams();
        this.app.schedule();
      },
    });
    this.instInput.value = this.instFilter;
    this.countEl = h('span', { class: 'count' });
    // The outcome of the last operator action.
    this.actionStatus = h('span', { class: 'note action-status', role: 'status' });
    this.tools = h('div', { class: 'table-tools' },
      h('label', { class: 'field', for: instFilterId, text: 'Filter instances' }), this.instInput, this.countEl, this.actionStatus);
    this.grid = new Grid({
      label: 'Instances',
      idPrefix: uid('inst'),
      columns: ALL_COLUMNS,
      layout: 'all',
      sort: this.sort,
      cellText: (i, col) => this.cellText(i, col),
      badgeClass: (i, col) => (col === 'health' ? HEALTH_BADGE[this.list[i].health] : this.list[i].draining ? 'draining' : 'serving'),
      rowClass: (i) => (this.list[i].failing ? 'failing' : ''),
      isSelected: (i) => this.list[i] && this.list[i].key === this.inspectKey,
      onActivate: (i) => this.inspect(this.list[i]),
      onSort: (col) => {
        this.sort = { col, dir: this.sort.col === col ? -this.sort.dir : 1 };
        this.grid.setSort(this.sort);
        this.listKey = '';
        this.app.schedule();
      },
    });
    this.buildColumns();
    this.grid.el.addEventListener('keydown', (ev) => {
      if (ev.key === 'Escape' && this.inspectKey) {
        ev.preventDefault();
        this.closeInspector();
      }
    });
    this.empty = h('div', { class: 'empty', hidden: true });
    this.inspector = h('section', { class: 'inspector', 'aria-label': 'Instance details', hidden: true });
    this.detail = h('section', { class: 'detail', 'aria-labelledby': this.titleId },
      h('nav', { 'aria-label': 'Breadcrumb' }, this.crumbs),
      h('div', { class: 'detail-head' }, this.title, this.kindEl),
      this.stats, this.tools, this.grid.el, this.empty, this.inspector);
    this.el = h('div', { class: 'services' }, side, this.detail, this.createDialog());
    main.append(this.el);
  }

  unmount() {
    this.treeRows.destroy();
    this.grid.rows.destroy();
  }

  buildColumns() {
    const endpoint = this.path.length === 3;
    let columns = endpoint ? ALL_COLUMNS.slice(1) : ALL_COLUMNS;
    let layout = endpoint ? 'endpoint' : 'all';
    if (this.ops) {
      columns = [...columns, this.actionsColumn];
      layout += '-ops';
    }
    this.grid.setColumns(columns, layout);
    if (endpoint && this.sort.col === 'service') this.sort = { col: 'address', dir: 1 };
    this.grid.setSort(this.sort);
  }

  saveParams() {
    const p = new URLSearchParams();
    if (this.treeFilter) p.set('q', this.treeFilter);
    if (this.statusFilter) p.set('status', this.statusFilter);
    if (this.instFilter) p.set('filter', this.instFilter);
    this.app.setParams(p);
  }

  go(path) {
    this.app.navigate(servicesURL(path) + location.search);
  }

  // ---- tree ----

  isExpanded(node, many) {
    if (this.expanded.has(node.key)) return true;
    if (this.collapsed.has(node.key)) return false;
    return node.level === 1 || !many;
  }

  flatten() {
    const f = this.treeFilter.trim().toLowerCase();
    const only = this.statusFilter; // 'draining', 'failing' or ''
    const many = this.model.root.endpoints > MANY_ENDPOINTS;
    const out = [];
    const matches = (n) => n.key.includes(f) || (n.level < 3 && n.sorted().some(matches));
    const visit = (node) => {
      const kids = node.sorted().filter((c) => (!only || c[only] > 0) && (!f || matches(c)));
      kids.forEach((c, i) => {
        const expanded = c.level < 3 && (f !== '' || this.isExpanded(c, many));
        out.push({ node: c, expanded, pos: i + 1, size: kids.length });
        if (expanded) visit(c);
      });
    };
    visit(this.model.root);
    const activeKey = this.treeActive >= 0 && this.flat[this.treeActive] ? this.flat[this.treeActive].node.key : '';
    this.flat = out;
    this.treeActive = activeKey ? out.findIndex((it) => it.node.key === activeKey) : -1;
    this.treeRows.setCount(out.length);
  }

  selectedIndex() {
    const key = this.path.join('/');
    return key ? this.flat.findIndex((it) => it.node.key === key) : -1;
  }

  createTreeRow() {
    const el = h('div', { class: 'titem', role: 'treeitem' });
    el.__twisty = h('span', { class: 'twisty', 'aria-hidden': 'true' });
    el.__name = h('span', { class: 'name' });
    el.__n = h('span', { class: 'n' });
    el.__drain = h('span', { class: 'badge draining' });
    el.__fail = h('span', { class: 'badge bad' });
    el.append(el.__twisty, el.__name, el.__n, el.__drain, el.__fail);
    return el;
  }

  updateTreeRow(el, i) {
    const it = this.flat[i];
    const n = it.node;
    if (el.__index !== i) {
      el.__index = i;
      el.id = `${this.treeId}-i${i}`;
    }
    setAttr(el, 'aria-level', String(n.level));
    setAttr(el, 'aria-setsize', String(it.size));
    setAttr(el, 'aria-posinset', String(it.pos));
    setAttr(el, 'aria-expanded', n.level < 3 ? String(it.expanded) : null);
    setAttr(el, 'aria-selected', n.key === this.path.join('/') ? 'true' : 'false');
    setAttr(el, 'aria-label', `${n.name}, ${KIND[n.level]}, ${plural(n.total, 'instance')}${n.draining ? `, ${num(n.draining)} draining` : ''}${n.failing ? `, ${num(n.failing)} failing` : ''}`);
    if (el.__level !== n.level) {
      el.__level = n.level;
      el.style.paddingLeft = `${4 + (n.level - 1) * 16}px`;
    }
    setClass(el, 'active', i === this.treeActive);
    setText(el.__twisty, n.level < 3 ? (it.expanded ? '▾' : '▸') : '');
    setText(el.__name, n.name);
    setText(el.__n, num(n.total));
    setText(el.__drain, n.draining ? `${num(n.draining)} draining` : '');
    show(el.__drain, n.draining > 0);
    setText(el.__fail, n.failing ? `${num(n.failing)} failing` : '');
    show(el.__fail, n.failing > 0);
  }

  refreshTree() {
    this.treeRows.render();
    const el = this.treeActive >= 0 ? this.treeRows.rowElement(this.treeActive) : null;
    setAttr(this.tree, 'aria-activedescendant', el && document.activeElement === this.tree ? el.id : null);
  }

  setTreeActive(i) {
    if (!this.flat.length) return;
    this.treeActive = Math.max(0, Math.min(i, this.flat.length - 1));
    this.treeRows.scrollToIndex(this.treeActive);
    this.refreshTree();
  }

  toggle(node, open) {
    const many = this.model.root.endpoints > MANY_ENDPOINTS;
    const isOpen = this.isExpanded(node, many);
    if (open === isOpen) return;
    if (open) {
      this.expanded.add(node.key);
      this.collapsed.delete(node.key);
    } else {
      this.collapsed.add(node.key);
      this.expanded.delete(node.key);
    }
    this.treeDirty = true;
    this.app.schedule();
  }

  onTreeClick(ev) {
    const row = ev.target instanceof Element ? ev.target.closest('.titem') : null;
    if (!row || row.__index === undefined) return;
    const it = this.flat[row.__index];
    if (!it) return;
    this.treeActive = row.__index;
    if (ev.target === row.__twisty && it.node.level < 3) {
      this.toggle(it.node, !it.expanded);
      return;
    }
    this.go(it.node.key.split('/'));
  }

  onTreeKey(ev) {
    const it = this.flat[this.treeActive];
    let handled = true;
    switch (ev.key) {
      case 'ArrowDown':
        this.setTreeActive(this.treeActive + 1);
        break;
      case 'ArrowUp':
        this.setTreeActive(this.treeActive - 1);
        break;
      case 'Home':
        this.setTreeActive(0);
        break;
      case 'End':
        this.setTreeActive(this.flat.length - 1);
        break;
      case 'ArrowRight':
        if (!it || it.node.level === 3) break;
        if (!it.expanded && this.treeFilter.trim() === '') this.toggle(it.node, true);
        else this.setTreeActive(this.treeActive + 1);
        break;
      case 'ArrowLeft':
        if (!it) break;
        if (it.expanded && it.node.level < 3 && this.treeFilter.trim() === '') this.toggle(it.node, false);
        else if (it.node.parent && it.node.parent.level > 0) this.setTreeActive(this.flat.findIndex((x) => x.node === it.node.parent));
        break;
      case 'Enter':
      case ' ':
        if (it) this.go(it.node.key.split('/'));
        break;
      default:
        handled = ev.key.length === 1 && /[a-z0-9-]/i.test(ev.key) && !ev.ctrlKey && !ev.metaKey && !ev.altKey && this.typeahead(ev.key.toLowerCase());
    }
    if (handled) ev.preventDefault();
  }

  // typeahead moves to the next row whose name starts with what was typed
  // within the last half second (the ARIA tree pattern's type-ahead).
  typeahead(ch) {
    const now = Date.now();
    this.typed = now - (this.typedAt || 0) < 500 ? this.typed + ch : ch;
    this.typedAt = now;
    const n = this.flat.length;
    const from = this.typed.length === 1 ? this.treeActive + 1 : Math.max(this.treeActive, 0);
    for (let k = 0; k < n; k += 1) {
      const i = (from + k) % n;
      if (this.flat[i].node.name.startsWith(this.typed)) {
        this.setTreeActive(i);
        return true;
      }
    }
    return false;
  }

  // ---- instances ----

  cellText(i, col) {
    const r = this.list[i];
    const inst = r.inst;
    switch (col) {
      case 'service':
        return r.service;
      case 'id':
        return inst.id;
      case 'address':
        return visible(inst.address);
      case 'transport':
        return inst.transport || '–';
      case 'status':
        return inst.status || 'serving';
      case 'health':
        return HEALTH_TEXT[r.health];
      case 'meta':
        return visible(r.meta);
      case 'age':
        return age(this.now - r.registeredMs);
      default:
        return '';
    }
  }

  // computeList keeps the scope's sorted, filtered rows: rebuilt when the
  // scope, filter or sort changes, otherwise updated in place from the
  // model's changes (O(n + k log k) for k changes, not a re-sort).
  computeList(node) {
    const f = this.instFilter.trim().toLowerCase();
    const key = `${node ? node.key : '-'}|${f}|${this.sort.col}|${this.sort.dir}`;
    const by = SORTS[this.sort.col] || SORTS.address;
    const order = this.sort.dir > 0 ? by : (a, b) => by(b, a);
    const keep = (r) => !f || r.search.includes(f);
    if (key !== this.listKey || node !== this.scopeNode) {
      this.listKey = key;
      this.scopeNode = node;
      this.listVersion = node ? node.version : -1;
      this.listSeq = this.model.changeSeq;
      const list = [];
      if (node) node.each((r) => {
        if (keep(r)) list.push(r);
      });
      list.sort(order);
      this.list = list;
      return true;
    }
    if (!node || node.version === this.listVersion) return false;
    this.listVersion = node.version;
    const changes = this.model.changesSince(this.listSeq);
    this.listSeq = this.model.changeSeq;
    if (changes === null) {
      this.listKey = '';
      return this.computeList(node);
    }
    const prefix = node.level === 0 ? '' : `${node.key}/`;
    const out = new Set();
    const add = new Set();
    for (const c of changes) {
      if (!c.rec.key.startsWith(prefix)) continue;
      // An update may move the row (sort) or change whether it matches.
      if (c.kind !== 'add') out.add(c.rec);
      if (c.kind !== 'remove') add.add(c.rec);
      else add.delete(c.rec);
    }
    if (out.size === 0 && add.size === 0) return false;
    let list = out.size ? this.list.filter((r) => !out.has(r)) : this.list;
    const ins = [...add].filter((r) => this.model.recs.get(r.key) === r && keep(r)).sort(order);
    if (ins.length) {
      const merged = new Array(list.length + ins.length);
      let i = 0;
      let j = 0;
      let k = 0;
      while (i < list.length && j < ins.length) merged[k++] = order(list[i], ins[j]) <= 0 ? list[i++] : ins[j++];
      while (i < list.length) merged[k++] = list[i++];
      while (j < ins.length) merged[k++] = ins[j++];
      list = merged;
    }
    this.list = list;
    return true;
  }

  inspect(rec) {
    if (!rec) return;
    this.inspectKey = rec.key;
    this.inspected = null;
    this.app.schedule();
    this.grid.refresh();
  }

  registeredText() {
    const t = this.inspectedRegistered;
    return `${dateTime(t)} (${age(this.now - t)} ago)`;
  }

  closeInspector() {
    this.inspectKey = '';
    this.inspectedSig = '';
    this.app.schedule();
    this.grid.refresh();
  }

  renderInspector() {
    if (!this.inspectKey) {
      show(this.inspector, false);
      return;
    }
    const rec = this.model.recs.get(this.inspectKey);
    // Before the first snapshot an instance that is not in the model yet
    // is not known to be absent: say so only once the page has synced.
    const state = rec ? `${rec.v}` : this.model.synced ? 'gone' : 'loading';
    const sig = `${this.inspectKey}|${state}`;
    if (sig === this.inspectedSig) {
      // Only the age moves: rewrite that text, keep the rest (and any
      // text the reader selected).
      if (this.inspectedAge) setText(this.inspectedAge, this.registeredText());
      return;
    }
    if (rec) this.inspected = { inst: rec.inst, goneAt: 0, rec };
    else if (this.inspected && !this.inspected.goneAt) this.inspected.goneAt = Date.now();
    this.inspectedSig = sig;
    const last = this.inspected;
    if (!last) {
      const text = state === 'loading' ? `Loading instance ${this.inspectKey}…` : `Instance ${this.inspectKey} is not registered.`;
      this.inspector.replaceChildren(h('p', { class: 'note', text }));
      show(this.inspector, true);
      return;
    }
    const inst = last.inst;
    const status = inst.status || 'serving';
    const md = inst.metadata || {};
    this.inspectedRegistered = Date.parse(inst.registered_at);
    const close = h('button', {
      type: 'button', class: 'btn small', text: 'Close', 'aria-label': 'Close instance details',
      onclick: () => {
        this.closeInspector();
        this.grid.el.focus();
      },
    });
    const name = instanceName(inst);
    const may = !last.goneAt && this.app.may('instances.operate', inst.namespace);
    const drain = may && status !== 'draining' ? h('button', {
      type: 'button', class: 'btn small', text: 'Drain…', 'aria-label': `Drain ${name}`, 'data-action': 'drain',
      onclick: (ev) => this.confirmAction('drain', inst, ev.currentTarget),
    }) : null;
    const deregister = may ? h('button', {
      type: 'button', class: 'btn small danger', text: 'Deregister…', 'aria-label': `Deregister ${name}`, 'data-action': 'deregister',
      onclick: (ev) => this.confirmAction('deregister', inst, ev.currentTarget),
    }) : null;
    const rows = [
      ['Service', `${inst.namespace}/${inst.component}/${inst.endpoint}`],
      ['Instance ID', inst.id],
      ['Address', visible(inst.address)],
      ['Transport', inst.transport || '–'],
      ['Status', status],
      ['Health', HEALTH_TEXT[last.rec.health]],
    ];
    const hl = inst.health;
    if (hl && hl.reason) rows.push(['Failure', visible(hl.reason)]);
    if (hl && hl.since) rows.push(['Verdict since', `${dateTime(Date.parse(hl.since))}${hl.checker ? ` by ${visible(hl.checker)}` : ''}`]);
    if (inst.check) rows.push(['Check', checkText(inst.check)]);
    this.inspectedAge = h('dd');
    setText(this.inspectedAge, this.registeredText());
    const dl = h('dl', { class: 'kv' }, rows.map(([k, v]) => [h('dt', { text: k }), h('dd', { text: v })]), h('dt', { text: 'Registered' }), this.inspectedAge);
    const keys = Object.keys(md).sort();
    this.inspector.replaceChildren();
    append(this.inspector, [
      h('header', {}, h('h2', { text: `${inst.namespace}/${inst.component}/${inst.endpoint}/${inst.id}` }),
        h('span', { class: `badge ${last.goneAt ? 'leave' : status}`, text: last.goneAt ? 'gone' : status }),
        last.rec.health && !last.goneAt ? h('span', { class: `badge ${HEALTH_BADGE[last.rec.health]}`, text: HEALTH_TEXT[last.rec.health] }) : null,
        drain, deregister, close),
      last.goneAt ? h('p', { class: 'note warn', text: `This instance left the registry at ${dateTime(last.goneAt)}; its last known state:` }) : null,
      dl,
      h('h3', { class: 'note', text: keys.length ? `Metadata (${keys.length})` : 'No metadata' }),
      keys.length ? h('dl', { class: 'kv' }, keys.map((k) => [h('dt', { text: visible(k) }), h('dd', { text: visible(md[k]) })])) : null,
    ]);
    show(this.inspector, true);
  }

  // ---- operator actions ----

  // createActions builds a row's action buttons. They are not tab stops
  // (the grid is one): keyboard users open the row (Enter) and use the
  // same buttons in the instance details.
  createActions(cell) {
    cell.__drain = h('button', { type: 'button', class: 'btn small', tabindex: '-1', text: 'Drain…', 'data-action': 'drain' });
    cell.__deregister = h('button', { type: 'button', class: 'btn small danger', tabindex: '-1', text: 'Deregister…', 'data-action': 'deregister' });
    cell.append(cell.__drain, cell.__deregister);
    cell.addEventListener('click', (ev) => {
      const b = ev.target instanceof Element ? ev.target.closest('button') : null;
      if (!b) return;
      ev.stopPropagation(); // not a click on the row
      const r = this.list[cell.parentElement.__index];
      if (r) this.confirmAction(b.dataset.action, r.inst, this.grid.el);
    });
  }

  renderActions(cell, i) {
    const inst = this.list[i].inst;
    const may = this.app.may('instances.operate', inst.namespace);
    show(cell.__drain, may && inst.status !== 'draining');
    show(cell.__deregister, may);
    if (may) {
      const name = instanceName(inst);
      setAttr(cell.__drain, 'aria-label', `Drain ${name}`);
      setAttr(cell.__deregister, 'aria-label', `Deregister ${name}`);
    }
  }

  // createDialog builds the confirmation dialog of the operator actions: a
  // modal dialog (focus stays in it, Escape cancels), labelled by its
  // title and described by its text; Cancel has the focus first.
  createDialog() {
    const titleId = uid('op-title');
    const textId = uid('op-text');
    this.dlgTitle = h('h2', { id: titleId });
    this.dlgText = h('p', { id: textId });
    this.dlgNote = h('p', { class: 'note' });
    this.dlgError = h('p', { class: 'note bad', role: 'alert', hidden: true });
    this.dlgCancel = h('button', { type: 'button', class: 'btn', text: 'Cancel', onclick: () => this.dialog.close() });
    this.dlgConfirm = h('button', { type: 'button', class: 'btn danger', onclick: () => this.runAction() });
    this.dialog = h('dialog', { class: 'op-dialog', 'aria-labelledby': titleId, 'aria-describedby': textId },
      this.dlgTitle, this.dlgText, this.dlgNote, this.dlgError, h('div', { class: 'actions' }, this.dlgCancel, this.dlgConfirm));
    this.dialog.addEventListener('cancel', (ev) => {
      if (this.dlgBusy) ev.preventDefault(); // the request is under way
    });
    this.dialog.addEventListener('close', () => {
      const back = this.dlgReturn && this.dlgReturn.isConnected ? this.dlgReturn : this.grid.el;
      this.dlgReturn = null;
      // The close event comes a task after the dialog closed: if the
      // focus has meanwhile moved on elsewhere (the user went on to the
      // filter, say), leave it there.
      const a = document.activeElement;
      if (a && a !== document.body && !this.dialog.contains(a) && !this.grid.el.contains(a)) return;
      back.focus();
    });
    return this.dialog;
  }

  // confirmAction asks before draining or deregistering inst; from is
  // where the focus returns.
  confirmAction(action, inst, from) {
    if (this.dlgBusy || !this.app.may('instances.operate', inst.namespace)) return;
    const name = instanceName(inst);
    this.pending = { action, inst };
    this.dlgReturn = from;
    const who = this.app.identity && this.app.identity.user ? ` as ${this.app.identity.user}` : '';
    if (action === 'drain') {
      setText(this.dlgTitle, `Drain ${name}?`);
      setText(this.dlgText, 'The instance stays registered, marked draining: resolvers and clients stop sending it new work. '
        + 'Its owner keeps the mark: a Go or CLI process adopts it, and a client that registered over HTTP may set it serving again.');
      setText(this.dlgConfirm, 'Drain');
    } else {
      setText(this.dlgTitle, `Deregister ${name}?`);
      setText(this.dlgText, 'The instance is removed from the registry now. If the process that registered it is still alive, it registers it again '
        + 'within its verification interval (about half a minute by default): to take a live process out of rotation, drain it or stop the process. '
        + 'Deregister instances whose owner is gone or misbehaving; a client that registered over HTTP gets 404 on its next heartbeat.');
      setText(this.dlgConfirm, 'Deregister');
    }
    setText(this.dlgNote, `Address ${inst.address}${inst.transport ? ` (${inst.transport})` : ''}, ${inst.status || 'serving'}. The server does it${who}; etcd checks the permission.`);
    this.dlgError.textContent = '';
    show(this.dlgError, false);
    this.dlgConfirm.disabled = false;
    this.dlgCancel.disabled = false;
    this.dialog.showModal();
    this.dlgCancel.focus();
  }

  async runAction() {
    const { action, inst } = this.pending || {};
    if (!action || this.dlgBusy) return;
    const name = instanceName(inst);
    const path = [inst.namespace, inst.component, inst.endpoint, inst.id].map(encodeURIComponent).join('/');
    this.dlgBusy = true;
    this.dlgConfirm.disabled = true;
    this.dlgCancel.disabled = true;
    show(this.dlgError, false);
    try {
      await fetchJSON(`/v1/registry/instances/${path}/${action}`, { method: 'POST' });
      this.dlgBusy = false;
      this.dialog.close();
      setClass(this.actionStatus, 'bad', false);
      setText(this.actionStatus, `${action === 'drain' ? 'Drained' : 'Deregistered'} ${name}.`);
    } catch (err) {
      this.dlgBusy = false;
      this.dlgError.textContent = `The server refused: ${err.message}`;
      show(this.dlgError, true);
      this.dlgConfirm.disabled = false;
      this.dlgCancel.disabled = false;
      this.dlgCancel.focus();
    }
  }

  // ---- frame ----

  update(dirty) {
    const m = this.model;
    this.now = Date.now();
    const routeChanged = dirty.has('route');
    if (dirty.has('identity')) {
      const ops = this.app.operatesAnywhere();
      if (ops !== this.ops) {
        this.ops = ops;
        this.buildColumns();
      }
      this.inspectedSig = '';
    }
    if (this.treeDirty || dirty.has('structure') || dirty.has('sync')) {
      this.treeDirty = false;
      this.flatten();
      if (routeChanged && this.path.length) {
        const sel = this.selectedIndex();
        if (sel >= 0) {
          this.treeActive = sel;
          this.treeRows.scrollToIndex(sel);
        }
      }
    }
    this.refreshTree();
    setText(this.rootCount, m.synced ? num(m.root.total) : '');
    setAttr(this.rootLink, 'aria-current', this.path.length === 0 ? 'page' : null);
    const f = this.treeFilter.trim();
    const noMatch = m.synced && this.flat.length === 0 && m.root.total > 0;
    setText(this.treeEmpty, noMatch ? (f ? `No service matches “${f}”.` : 'No service has draining instances.') : '');
    show(this.treeEmpty, noMatch);

    // Header.
    const node = this.path.length ? m.node(this.path) : m.root;
    const name = this.path.length ? this.path[this.path.length - 1] : 'All services';
    setText(this.title, name);
    setText(this.kindEl, this.path.length ? KIND[this.path.length] : '');
    if (routeChanged) {
      this.app.setTitle(this.path.length ? this.path.join('/') : 'Services');
      const parts = [h('li', {}, h('a', { href: `${BASE}services`, text: 'All services' }))];
      this.path.forEach((p, i) => {
        const last = i === this.path.length - 1;
        parts.push(h('li', {}, last ? h('span', { 'aria-current': 'page', text: p }) : h('a', { href: servicesURL(this.path.slice(0, i + 1)), text: p })));
      });
      if (this.path.length === 0) parts[0] = h('li', {}, h('span', { 'aria-current': 'page', text: 'All services' }));
      this.crumbs.replaceChildren(...parts);
    }

    // Empty states.
    const loading = !m.synced;
    const emptyRegistry = m.synced && m.root.total === 0;
    const emptyScope = m.synced && !emptyRegistry && !node;
    const emptyKind = loading ? 'loading' : emptyRegistry ? 'registry' : emptyScope ? `scope:${this.path.join('/')}` : '';
    if (emptyKind !== this.emptyKind) {
      this.emptyKind = emptyKind;
      if (loading) this.empty.replaceChildren(h('p', { text: 'Loading the registry…' }));
      else if (emptyRegistry) {
        this.empty.replaceChildren(h('h2', { text: 'No instances registered yet' }), ...registerHelp(this.path));
      } else if (emptyScope) {
        this.empty.replaceChildren(
          h('h2', { text: `No instances in ${this.path.join('/')} right now` }),
          h('p', { text: 'Instances appear here as soon as they register; instances that left are in the Events page.' }),
          ...registerHelp(this.path),
        );
      }
      show(this.empty, emptyKind !== '');
      show(this.stats, !loading && !emptyRegistry);
      show(this.tools, emptyKind === '');
      show(this.grid.el, emptyKind === '');
      setAttr(this.detail, 'aria-busy', loading ? 'true' : null);
    }

    // Stats and sparkline.
    const total = node ? node.total : 0;
    setText(this.nTotal, num(total));
    setText(this.nServing, num(node ? node.serving : 0));
    setText(this.nDraining, num(node ? node.draining : 0));
    setText(this.nFailing, num(node ? node.failing : 0));
    setClass(this.nFailing, 'bad', !!node && node.failing > 0);
    show(this.endpointsCard, this.path.length < 3);
    setText(this.nEndpoints, num(node ? node.endpoints : 0));
    if (dirty.has('history') || dirty.has('tick') || routeChanged) {
      this.spark.draw(m.series(this.path.join('/')), total, this.now, m.since || this.now);
      setText(this.sparkNow, num(total));
      setText(this.sparkLabel, m.since && this.now - m.since < HISTORY_MS ? `Instances since ${clock(m.since).slice(0, 8)}` : `Instances, last ${HISTORY_MS / 60000} minutes`);
    }

    // Instances.
    const listChanged = this.computeList(node);
    if (listChanged) {
      this.grid.setCount(this.list.length);
      const f2 = this.instFilter.trim();
      setText(this.countEl, f2 ? `${num(this.list.length)} of ${plural(total, 'instance')} match` : plural(this.list.length, 'instance'));
    }
    if (listChanged || dirty.has('instances') || dirty.has('tick') || dirty.has('identity') || routeChanged) this.grid.refresh();
    this.renderInspector();
  }
}
