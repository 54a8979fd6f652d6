// DOM helpers. Untrusted data (instance names, addresses, metadata, token
// members) only ever reaches the page as text nodes, textContent or
// attribute values set through setAttribute: nothing here parses HTML.

const SVG = 'http://www.w3.org/2000/svg';

// h creates an element: props sets attributes (class, text, on<event>
// listeners, dataset; true sets an empty attribute, null/false skips), and
// children are nodes or strings (appended as text).
export function h(tag, props, ...children) {
  return build(document.createElement(tag), props, children);
}

// s creates an SVG element the same way.
export function s(tag, props, ...children) {
  return build(document.createElementNS(SVG, tag), props, children);
}

function build(el, props, children) {
  if (props) {
    for (const [k, v] of Object.entries(props)) {
      if (v === null || v === undefined || v === false) continue;
      if (k === 'class') el.setAttribute('class', v);
      else if (k === 'text') el.textContent = String(v);
      else if (k === 'dataset') Object.assign(el.dataset, v);
      else if (k.startsWith('on') && typeof v === 'function') el.addEventListener(k.slice(2), v);
      else el.setAttribute(k, v === true ? '' : String(v));
    }
  }
  append(el, children);
  return el;
}

export function append(el, children) {
  for (const c of children.flat(Infinity)) {
    if (c === null || c === undefined || c === false) continue;
    el.append(c instanceof Node ? c : String(c));
  }
  return el;
}

// setText changes an element's text only when it differs from what this
// helper last wrote (no DOM read, no needless mutation).
export function setText(el, text) {
  if (el.__text !== text) {
    el.__text = text;
    el.textContent = text;
  }
}

// setAttr sets (or, for null, removes) an attribute when it changed.
export function setAttr(el, name, value) {
  const key = '__a_' + name;
  if (el[key] === value) return;
  el[key] = value;
  if (value === null) el.removeAttribute(name);
  else el.setAttribute(name, value);
}

export function setClass(el, cls, on) {
  const key = '__c_' + cls;
  if (el[key] === on) return;
  el[key] = on;
  el.classList.toggle(cls, on);
}

// show hides or shows an element through the hidden attribute.
export function show(el, visible) {
  if (el.hidden === !visible) return;
  el.hidden = !visible;
}

let ids = 0;
export function uid(prefix) {
  ids += 1;
  return `${prefix}-${ids}`;
}

// isTyping reports whether a keyboard event targets a text field.
export function isTyping(ev) {
  const t = ev.target;
  return t instanceof HTMLElement && (t.isContentEditable || t.matches('input, textarea, select'));
}
