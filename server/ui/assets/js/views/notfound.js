// The page for a path under /ui/ that the dashboard does not know.

import { h } from '../dom.js';

export class NotFoundView {
  constructor(app) {
    this.app = app;
  }

  mount(main) {
    this.app.setTitle('Not found');
    main.append(h('div', { class: 'page' },
      h('h1', { text: 'No such page' }),
      h('div', { class: 'empty' },
        h('p', {}, 'The dashboard has no page at ', h('code', { text: location.pathname }), '.'),
        h('p', {}, 'Try ', h('a', { href: '/ui/services', text: 'Services' }), ', ', h('a', { href: '/ui/events', text: 'Events' }), ', ',
          h('a', { href: '/ui/cluster', text: 'Cluster' }), ' or ', h('a', { href: '/ui/bootstrap', text: 'Bootstrap' }), '.'))));
  }

  update() {}
}
