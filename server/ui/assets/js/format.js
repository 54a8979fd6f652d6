// Formatting of numbers, sizes, durations and times for display.

const nf = new Intl.NumberFormat('en-US');

export function num(n) {
  return nf.format(n);
}

export function plural(n, one, many) {
  return `${num(n)} ${n === 1 ? one : many || one + 's'}`;
}

// age renders a duration in ms compactly: 4s, 3m 12s, 2h 5m, 3d 4h.
export function age(ms) {
  if (!(ms >= 0)) return '–';
  const s = Math.floor(ms / 1000);
  if (s < 60) return `${s}s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${s % 60}s`;
  const h = Math.floor(m / 60);
  if (h < 48) return `${h}h ${m % 60}m`;
  const d = Math.floor(h / 24);
  return `${d}d ${h % 24}h`;
}

export function bytes(n) {
  if (!(n >= 0)) return '–';
  const units = ['B', 'KiB', 'MiB', 'GiB', 'TiB'];
  let i = 0;
  while (n >= 1024 && i < units.length - 1) {
    n /= 1024;
    i += 1;
  }
  return `${i === 0 ? n : n.toFixed(n < 10 ? 1 : 0)} ${units[i]}`;
}

function pad(n, w = 2) {
  return String(n).padStart(w, '0');
}

// clock renders a time of day with milliseconds: 14:03:27.091.
export function clock(ms) {
  const d = new Date(ms);
  return `${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}.${pad(d.getMilliseconds(), 3)}`;
}

// dateTime renders an absolute local time: 2026-11-24 14:03:27.
export function dateTime(ms) {
  const d = new Date(ms);
  if (Number.isNaN(d.getTime())) return '–';
  return `${d.getFullYear()}-${pad(d.getMonth() + 1)}-${pad(d.getDate())} ${pad(d.getHours())}:${pad(d.getMinutes())}:${pad(d.getSeconds())}`;
}

// HIDDEN matches what changes how the text beside it is shown, or shows
// nothing at all: bidirectional overrides, embeddings, isolates and marks
// (a value holding U+202E showed the metadata after it reversed), the
// zero-width space, word joiner and byte-order mark, and control
// characters other than tab and newline. Joiners (U+200C, U+200D) stay:
// emoji and scripts need them.
const HIDDEN = /[\u0000-\u0008\u000b\u000c\u000e-\u001f\u007f-\u009f\u061c\u200b\u200e\u200f\u202a-\u202e\u2060-\u2064\u2066-\u2069\ufeff]/g;

// visible renders untrusted text (addresses, metadata, token members)
// with every HIDDEN character shown as ⟨U+XXXX⟩, so that one value can
// neither reorder nor hide the text around it, nor hide its own content.
export function visible(s) {
  if (s === undefined || s === null) return '';
  const str = String(s);
  HIDDEN.lastIndex = 0;
  if (!HIDDEN.test(str)) return str;
  return str.replace(HIDDEN, (c) => `⟨U+${c.codePointAt(0).toString(16).toUpperCase().padStart(4, '0')}⟩`);
}

// metaText renders metadata as "k=v  k=v", keys sorted.
export function metaText(md) {
  if (!md) return '';
  return Object.keys(md)
    .sort()
    .map((k) => `${k}=${md[k]}`)
    .join('  ');
}
