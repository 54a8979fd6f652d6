// Client-side routes under /ui/. The server answers every path under /ui/
// with the application, and the application decides what it shows.

const LABEL = /^[a-z0-9]([a-z0-9-]{0,61}[a-z0-9])?$/;
const ID = /^[0-9a-f]{16}$/;

export const BASE = '/ui/';

// parseRoute turns a location into {section, path, id, token, params}.
export function parseRoute(pathname, search) {
  const params = new URLSearchParams(search);
  let rest = pathname.startsWith(BASE) ? pathname.slice(BASE.length) : '';
  rest = rest.replace(/\/+$/, '');
  let parts;
  try {
    parts = rest === '' ? [] : rest.split('/').map(decodeURIComponent);
  } catch {
    return { section: 'notfound', params };
  }
  if (parts.length === 0) return { section: 'services', path: [], id: '', params };
  const [head, ...tail] = parts;
  switch (head) {
    case 'services': {
      const names = tail.slice(0, 3);
      const id = tail[3] || '';
      if (tail.length > 4 || !names.every((n) => LABEL.test(n)) || (id && (names.length < 3 || !ID.test(id)))) break;
      return { section: 'services', path: names, id, params };
    }
    case 'events':
    case 'cluster':
      if (tail.length === 0) return { section: head, params };
      break;
    case 'bootstrap':
      if (tail.length === 0) return { section: 'bootstrap', token: '', params };
      if (tail.length === 1 && tail[0] !== '') return { section: 'bootstrap', token: tail[0], params };
      break;
    default:
      break;
  }
  return { section: 'notfound', params };
}

export function servicesURL(path, id) {
  const parts = ['services', ...path.map(encodeURIComponent)];
  if (id) parts.push(encodeURIComponent(id));
  return BASE + parts.join('/');
}

export function isLabel(s) {
  return LABEL.test(s);
}
