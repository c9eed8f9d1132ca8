// DOM helpers. Everything shown comes from clients and history and is
// untrusted: it only ever becomes text (textContent, attribute values set
// with setAttribute), never markup. No function here parses HTML.

// h builds an element. attrs: attribute names written by this code only
// (class, href, data-*, aria-*, …), plus "on" handlers; children: nodes,
// strings (become text nodes), arrays, null/undefined/false (skipped).
export function h(tag, attrs, ...children) {
  const el = document.createElement(tag);
  for (const [k, v] of Object.entries(attrs || {})) {
    if (v === null || v === undefined || v === false) continue;
    if (k.startsWith('on') && typeof v === 'function') {
      el.addEventListener(k.slice(2), v);
    } else if (v === true) {
      el.setAttribute(k, '');
    } else {
      el.setAttribute(k, String(v));
    }
  }
  append(el, children);
  return el;
}

function append(el, children) {
  for (const c of children) {
    if (c === null || c === undefined || c === false) continue;
    if (Array.isArray(c)) append(el, c);
    else if (c instanceof Node) el.appendChild(c);
    else el.appendChild(document.createTextNode(String(c)));
  }
}

// replace empties el and appends children.
export function replace(el, ...children) {
  el.replaceChildren();
  append(el, children);
}

// time formats an RFC 3339 time in the browser's zone, or "—".
export function time(t) {
  if (!t) return '—';
  const d = new Date(t);
  if (Number.isNaN(d.getTime())) return String(t);
  return d.toLocaleString(undefined, { hour12: false }) + '.' + String(d.getMilliseconds()).padStart(3, '0');
}

// duration formats milliseconds: "850 ms", "12.3 s", "4m 05s", "2h 03m".
export function duration(ms) {
  if (ms === null || ms === undefined || Number.isNaN(ms)) return '—';
  if (ms < 0) ms = 0;
  if (ms < 1000) return `${Math.round(ms)} ms`;
  const s = ms / 1000;
  if (s < 60) return `${s.toFixed(1)} s`;
  const m = Math.floor(s / 60);
  if (m < 60) return `${m}m ${String(Math.floor(s % 60)).padStart(2, '0')}s`;
  return `${Math.floor(m / 60)}h ${String(m % 60).padStart(2, '0')}m`;
}

// labels shows a label map as a list of key=value chips.
export function labels(m) {
  const entries = Object.entries(m || {}).sort(([a], [b]) => (a < b ? -1 : 1));
  if (entries.length === 0) return h('span', { class: 'muted' }, 'none');
  return h('ul', { class: 'chips', 'aria-label': 'labels' },
    entries.map(([k, v]) => h('li', { class: 'chip' }, `${k}=${v}`)));
}

// table builds a table with a caption, header cells and rows of cells.
export function table(caption, heads, rows, empty) {
  if (rows.length === 0) return h('p', { class: 'muted' }, empty);
  // The wrapper scrolls on a narrow window; it takes the focus so that the
  // keyboard scrolls it too.
  return h('div', { class: 'scroll', tabindex: '0', role: 'region', 'aria-label': caption },
    // Explicit roles keep the table a table to screen readers when a narrow
    // window lays its rows out as cards (display: block).
    h('table', { role: 'table' },
      h('caption', {}, caption),
      h('thead', { role: 'rowgroup' }, h('tr', { role: 'row' }, heads.map((c) => h('th', { scope: 'col', role: 'columnheader' }, c)))),
      h('tbody', { role: 'rowgroup' }, rows.map((r) => h('tr', { role: 'row' },
        r.map((c, i) => h('td', { role: 'cell', 'data-label': heads[i] }, c)))))));
}
