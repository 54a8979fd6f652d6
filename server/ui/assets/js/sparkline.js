// A step chart of a count over the last minutes, drawn as SVG.

import { s, setAttr } from './dom.js';
import { HISTORY_MS } from './model.js';
import { num } from './format.js';

const W = 300;
const H = 34;

export class Sparkline {
  constructor() {
    this.area = s('path', { class: 'area' });
    this.line = s('path', { class: 'line' });
    this.el = s('svg', { class: 'sparkline', viewBox: `0 0 ${W} ${H}`, preserveAspectRatio: 'none', role: 'img', 'aria-label': 'No history yet' }, this.area, this.line);
  }

  // draw plots samples [{t, n}] (ascending t, each count holding until the
  // next) from since (at most HISTORY_MS ago) to now; current is the count
  // now.
  draw(samples, current, now, since) {
    const start = Math.max(now - HISTORY_MS, Math.min(since, now));
    const span = Math.max(1, now - start);
    const pts = [];
    let prev = null;
    for (const p of samples) {
      if (p.t <= start) {
        prev = p.n;
        continue;
      }
      // A node's first sample is its first count since the page watches
      // (start is never earlier): before it there was none.
      if (pts.length === 0) pts.push({ t: start, n: prev ?? 0 });
      pts.push({ t: p.t, n: p.n });
    }
    if (pts.length === 0) pts.push({ t: start, n: prev ?? current });
    pts.push({ t: now, n: current });
    let max = 0;
    let min = Infinity;
    for (const p of pts) {
      max = Math.max(max, p.n);
      min = Math.min(min, p.n);
    }
    const top = max === 0 ? 1 : max;
    const x = (t) => ((t - start) / span) * W;
    const y = (n) => H - 2 - (n / top) * (H - 4);
    let d = `M${x(pts[0].t).toFixed(1)},${y(pts[0].n).toFixed(1)}`;
    for (let i = 1; i < pts.length; i += 1) {
      d += `H${x(pts[i].t).toFixed(1)}V${y(pts[i].n).toFixed(1)}`;
    }
    setAttr(this.line, 'd', d);
    setAttr(this.area, 'd', `${d}V${H}H${x(pts[0].t).toFixed(1)}Z`);
    const minutes = Math.max(1, Math.round(span / 60000));
    setAttr(this.el, 'aria-label', `Instance count over the last ${minutes === 1 ? 'minute' : `${minutes} minutes`}: between ${num(min)} and ${num(max)}, now ${num(current)}`);
  }
}
