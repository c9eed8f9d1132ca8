// Quotas: each quota as merged with its tenant overrides, its occupancy per
// level and scope, and its holders (lease views, never tokens). The page
// reads GET /api/v1/admin/quotas when the view opens and again on every
// tick of the overview's event stream, which comes after every lease event;
// a reload of the quota file shows at the next one, or with Refresh.
import { h, labels, table } from './dom.js';
import { call } from './api.js';
import { fail, remaining, render as redraw } from './app.js';

export const live = true;

let last = null; // the latest answer: { data } or { err }
let loading = false;
let again = false; // a tick came while a request was out
let drawn = false; // the next render draws the answer just come, without asking again

function refresh() {
  if (loading) { again = true; return; }
  loading = true;
  call('GET', '/api/v1/admin/quotas').then((data) => { last = { data }; }, (err) => {
    if (!last || last.err) fail('Reading quotas', err);
    last = { err, data: last && last.data };
  }).finally(() => {
    loading = false;
    if (again) { again = false; refresh(); return; }
    if (!location.hash.startsWith('#quotas')) return;
    drawn = true;
    redraw(false);
  });
}

function cap(n) { return n > 0 ? String(n) : 'no cap'; }

function used(s) {
  const full = s.cap > 0 && s.used >= s.cap;
  return h('span', { class: full ? 'use full' : 'use' }, String(s.used), full ? ' (full)' : '');
}

function scopeRows(o) {
  const row = (level, s) => [level, s.tenant_id || '—', s.user_id || '—', used(s), cap(s.cap)];
  return [row('global', o.global), ...o.tenants.map((s) => row('tenant', s)), ...o.users.map((s) => row('user', s))];
}

function match(m) {
  const parts = [];
  if (m.client_type) parts.push(h('span', {}, 'client type ', h('code', {}, m.client_type)));
  if (m.labels && Object.keys(m.labels).length) parts.push(h('span', {}, 'labels ', labels(m.labels)));
  if (parts.length === 0) return h('span', {}, 'every acquire');
  return parts;
}

function caps(c) {
  return ['global', 'tenant', 'user'].filter((l) => c[l]).map((l) => `${l} ${c[l]}`).join(', ') || 'none';
}

function quota(q) {
  const id = `quota-${q.name}`;
  const overrides = Object.entries(q.overrides || {}).sort(([a], [b]) => (a < b ? -1 : 1));
  return h('section', { class: 'quota card', 'aria-labelledby': id },
    h('h2', { id }, q.name),
    h('dl', { class: 'fields' },
      h('dt', {}, 'Governs'), h('dd', { class: 'match' }, match(q.match)),
      h('dt', {}, 'Caps'), h('dd', {}, caps(q.levels)),
      overrides.length ? [h('dt', {}, 'Tenant overrides'),
        h('dd', {}, overrides.map(([t, c], i) => [i ? '; ' : '', h('code', {}, t), `: ${caps(c)}`]))] : null),
    table(`Occupancy of ${q.name}`, ['Level', 'Tenant', 'User', 'Used', 'Cap'], scopeRows(q.occupancy), 'No occupancy.'),
    table(`Holders of ${q.name}`, ['Task', 'User', 'Context', 'Epoch', 'Remaining'], q.holders.map((l) => [
      h('span', { class: 'task' }, l.task_id),
      l.user_id,
      h('span', {}, h('code', {}, l.context_id), ' on ', h('code', {}, l.client_id)),
      String(l.epoch),
      h('span', { class: 'countdown', 'data-expires': l.expires_at }, remaining(l.expires_at)),
    ]), 'No lease holds a slot of this quota.'));
}

export function render(r) {
  if (drawn) {
    drawn = false;
  } else {
    refresh();
    // A tick keeps what is shown until the answer comes.
    if (r.live && last) return null;
  }
  const head = h('h1', { id: 'quotas-title' }, 'Quotas');
  const d = last && last.data;
  let body;
  if (!d) {
    body = last && last.err ? h('p', { class: 'error' }, 'The quotas could not be read.') : h('p', { class: 'muted' }, 'Reading the quotas…');
  } else {
    body = [
      d.broken ? h('div', { class: 'banner', role: 'alert' },
        h('strong', {}, 'The quota file is broken (quota_unavailable). '),
        'Acquires its quotas govern are refused until a good file is loaded. ',
        h('span', { class: 'reason' }, d.broken)) : null,
      d.quotas.length === 0
        ? h('p', { class: 'muted' }, 'No quotas are in force: the broker runs without a quota file (--quota-file), or the file defines none. No acquire is capped.')
        : d.quotas.map(quota),
    ];
  }
  return h('section', { 'aria-labelledby': 'quotas-title' }, head,
    h('p', { class: 'muted' }, 'Concurrent leases per quota, level and scope. Updated with every lease event. ',
      h('button', { type: 'button', 'data-key': 'quotas-refresh', onclick: () => refresh() }, 'Refresh')), body);
}
