// Windowed rendering: only the rows in view (plus a few) exist in the DOM,
// whatever the number of items. Rows are reused in DOM order, so row j of
// the window always shows item first+j, and a row's cells are rewritten
// only when what they show changed.

import { h, setAttr, setClass, setText } from './dom.js';

export class VirtualRows {
  constructor({ scroller, rowHeight, createRow, updateRow, overscan = 6 }) {
    this.scroller = scroller;
    this.rowHeight = rowHeight;
    this.createRow = createRow;
    this.updateRow = updateRow;
    this.overscan = overscan;
    this.spacer = h('div', { class: 'spacer' });
    this.win = h('div', { class: 'window' });
    this.spacer.append(this.win);
    scroller.append(this.spacer);
    this.rows = [];
    this.count = 0;
    this.first = -1;
    this.top = 0;
    this.viewH = 600;
    this.pending = false;
    this.onResize = null;
    scroller.addEventListener(
      'scroll',
      () => {
        this.top = scroller.scrollTop;
        this.request();
      },
      { passive: true },
    );
    this.ro = new ResizeObserver(() => {
      this.viewH = scroller.clientHeight || this.viewH;
      this.onResize?.(scroller.offsetWidth - scroller.clientWidth);
      this.request();
    });
    this.ro.observe(scroller);
  }

  destroy() {
    this.ro.disconnect();
  }

  setCount(n) {
    if (n === this.count) return;
    this.count = n;
    this.spacer.style.height = `${n * this.rowHeight}px`;
    const max = Math.max(0, n * this.rowHeight - this.viewH);
    if (this.top > max) this.top = max;
  }

  // request renders on the next animation frame (scrolling, resizing).
  request() {
    if (this.pending) return;
    this.pending = true;
    requestAnimationFrame(() => {
      this.pending = false;
      this.render();
    });
  }

  render() {
    const rh = this.rowHeight;
    const first = Math.max(0, Math.floor(this.top / rh) - this.overscan);
    const want = Math.ceil(this.viewH / rh) + 2 * this.overscan;
    const n = Math.max(0, Math.min(want, this.count - first));
    while (this.rows.length < n) {
      const el = this.createRow();
      this.win.append(el);
      this.rows.push(el);
    }
    while (this.rows.length > n) this.rows.pop().remove();
    if (first !== this.first) {
      this.first = first;
      this.win.style.transform = `translateY(${first * rh}px)`;
    }
    for (let j = 0; j < n; j += 1) this.updateRow(this.rows[j], first + j);
  }

  rowElement(i) {
    const j = i - this.first;
    return j >= 0 && j < this.rows.length ? this.rows[j] : null;
  }

  // scrollToIndex scrolls the least needed to show item i.
  scrollToIndex(i) {
    const rh = this.rowHeight;
    const top = i * rh;
    let st = this.top;
    if (top < st) st = top;
    else if (top + rh > st + this.viewH) st = top + rh - this.viewH;
    if (st !== this.top) {
      this.top = st;
      this.scroller.scrollTop = st;
    }
  }

  scrollTo(top) {
    this.top = Math.max(0, top);
    this.scroller.scrollTop = this.top;
  }

  pageRows() {
    return Math.max(1, Math.floor(this.viewH / this.rowHeight) - 1);
  }
}

// Grid is a virtualised ARIA grid: a header row of (optionally sortable)
// column headers and a windowed body. The grid element takes the focus and
// points at the active row with aria-activedescendant; arrows, Page Up/Down,
// Home and End move it, Enter activates it.
export class Grid {
  // columns: [{id, title, cls, sortable, badge, tip, create, render}];
  // cellText(i, col) gives a cell's text, badgeClass(i, col) the class of
  // a badge column's badge, rowClass(i) a class marking the row ('' for
  // none); a tip column repeats its text as a tooltip; a
  // column with create(cell) and render(cell, i) builds and updates its
  // cells itself (controls). onActivate(i) runs on Enter or click.
  constructor({ label, columns, rowHeight = 30, idPrefix, cellText, badgeClass, rowClass, isSelected, onActivate, sort, onSort, layout }) {
    this.idPrefix = idPrefix;
    this.cellText = cellText;
    this.badgeClass = badgeClass || (() => '');
    this.rowClass = rowClass || (() => '');
    this.isSelected = isSelected || (() => false);
    this.onActivate = onActivate || (() => {});
    this.onSort = onSort;
    this.sort = sort || null;
    this.active = -1;
    this.count = 0;
    this.version = 0;
    this.el = h('div', { class: 'grid', role: 'grid', tabindex: '0', 'aria-label': label, 'aria-rowcount': '1' });
    this.head = h('div', { class: 'ghead', role: 'row', 'aria-rowindex': '1' });
    this.scroller = h('div', { class: 'scroller' });
    this.el.append(this.head, this.scroller);
    this.rows = new VirtualRows({
      scroller: this.scroller,
      rowHeight,
      createRow: () => this.createRow(),
      updateRow: (el, i) => this.updateRow(el, i),
    });
    this.rows.onResize = (gutter) => {
      this.head.style.paddingRight = `${12 + gutter}px`;
    };
    this.setColumns(columns, layout);
    this.el.addEventListener('keydown', (ev) => this.onKey(ev));
    this.el.addEventListener('focus', () => {
      if (this.active < 0 && this.count > 0) this.setActive(Math.floor(this.rows.top / this.rows.rowHeight), false);
      else this.refresh();
    });
    this.el.addEventListener('blur', () => this.refresh());
    this.scroller.addEventListener('click', (ev) => {
      const row = ev.target instanceof Element ? ev.target.closest('.grow') : null;
      if (!row || row.__index === undefined) return;
      this.setActive(row.__index, false);
      this.onActivate(row.__index);
    });
  }

  // setColumns sets the columns; layout names the column layout, a class
  // of the stylesheet (cols-<layout>), which sizes them for the screen.
  setColumns(columns, layout) {
    this.columns = columns;
    if (this.layout) this.el.classList.remove(`cols-${this.layout}`);
    this.layout = layout;
    this.el.classList.add(`cols-${layout}`);
    setAttr(this.el, 'aria-colcount', String(columns.length));
    this.head.replaceChildren(
      ...columns.map((c) => {
        const hd = h('div', { class: `cell ${c.cls || ''}`, role: 'columnheader' });
        if (c.sortable && this.onSort) {
          hd.append(h('button', { type: 'button', text: c.title, onclick: () => this.onSort(c.id) }));
        } else {
          hd.textContent = c.title;
        }
        hd.__col = c.id;
        return hd;
      }),
    );
    for (const el of this.rows.rows) el.remove();
    this.rows.rows = [];
    this.rows.first = -1;
    this.setSort(this.sort);
  }

  setSort(sort) {
    this.sort = sort;
    for (const hd of this.head.children) {
      const c = this.columns.find((x) => x.id === hd.__col);
      if (!c || !c.sortable) continue;
      setAttr(hd, 'aria-sort', sort && sort.col === c.id ? (sort.dir > 0 ? 'ascending' : 'descending') : 'none');
    }
  }

  createRow() {
    const row = h('div', { class: 'grow', role: 'row' });
    for (const c of this.columns) {
      const cell = h('div', { class: `cell ${c.cls || ''}`, role: 'gridcell' });
      cell.__t = cell;
      if (c.create) {
        c.create(cell);
        row.append(cell);
        continue;
      }
      if (c.badge) {
        cell.__t = h('span', { class: 'badge' });
        cell.append(cell.__t);
      }
      row.append(cell);
    }
    return row;
  }

  updateRow(row, i) {
    if (row.__index !== i) {
      row.__index = i;
      row.id = `${this.idPrefix}-r${i}`;
      setAttr(row, 'aria-rowindex', String(i + 2));
    }
    setClass(row, 'active', i === this.active);
    const mark = this.rowClass(i);
    if (row.__mark !== mark) {
      if (row.__mark) row.classList.remove(row.__mark);
      if (mark) row.classList.add(mark);
      row.__mark = mark;
    }
    setAttr(row, 'aria-selected', this.isSelected(i) ? 'true' : 'false');
    const cells = row.children;
    for (let c = 0; c < this.columns.length; c += 1) {
      const cell = cells[c];
      const col = this.columns[c];
      if (col.render) {
        col.render(cell, i);
        continue;
      }
      const text = this.cellText(i, col.id);
      setText(cell.__t, text);
      if (col.badge) setAttr(cell.__t, 'class', `badge ${this.badgeClass(i, col.id)}`);
      if (col.tip) setAttr(cell, 'title', text || null);
    }
  }

  setCount(n) {
    this.count = n;
    this.rows.setCount(n);
    setAttr(this.el, 'aria-rowcount', String(n + 1));
    if (this.active >= n) this.active = n - 1;
  }

  // refresh re-renders the rows in view (now: the caller is in a frame).
  refresh() {
    this.rows.render();
    this.updateActiveDescendant();
  }

  updateActiveDescendant() {
    const el = this.active >= 0 ? this.rows.rowElement(this.active) : null;
    setAttr(this.el, 'aria-activedescendant', el && document.activeElement === this.el ? el.id : null);
  }

  setActive(i, scroll = true) {
    if (this.count === 0) return;
    this.active = Math.max(0, Math.min(i, this.count - 1));
    if (scroll) this.rows.scrollToIndex(this.active);
    this.refresh();
  }

  onKey(ev) {
    if (ev.target !== this.el) return;
    const page = this.rows.pageRows();
    let next = null;
    switch (ev.key) {
      case 'ArrowDown':
        next = this.active + 1;
        break;
      case 'ArrowUp':
        next = this.active - 1;
        break;
      case 'PageDown':
        next = this.active + page;
        break;
      case 'PageUp':
        next = this.active - page;
        break;
      case 'Home':
        next = 0;
        break;
      case 'End':
        next = this.count - 1;
        break;
      case 'Enter':
      case ' ':
        if (this.active >= 0) this.onActivate(this.active);
        ev.preventDefault();
        return;
      default:
        return;
    }
    ev.preventDefault();
    this.setActive(next < 0 ? 0 : next);
  }
}
