// Overview: per user, the clients and the contexts by state, live.
import { h, time, labels, table } from './dom.js';
import { call, seg } from './api.js';
import { confirm, say, fail, ago, remaining } from './app.js';

export const live = true;

// The states a pool may count contexts by, in the order shown, with their
// labels. The page shows the states the broker reports, whatever they are:
// these in this order, then any other by its key, sorted.
const STATES = [['idle', 'Idle'], ['leased', 'Leased'], ['held', 'Held'], ['not_live', 'Not live'], ['human', 'Human']];

// states lists a pool's counts as [key, label, count].
export function states(counts) {
  const c = counts || {};
  const known = new Map(STATES);
  const extra = Object.keys(c).filter((k) => !known.has(k)).sort();
  return [...STATES.filter(([k]) => k in c), ...extra.map((k) => [k, k.replace(/_/g, ' ').replace(/^./, (x) => x.toUpperCase())])]
    .map(([k, label]) => [k, label, Number(c[k]) || 0]);
}

async function disconnect(c) {
  const ok = await confirm('Disconnect client',
    `Disconnect ${c.name || c.client_id} (${c.client_id}) of ${c.user_id}? Its connection is closed with 4403; it may connect again.`,
    'Disconnect');
  if (!ok) return;
  try {
    const r = await call('DELETE', `/api/v1/admin/users/${seg(c.user_id)}/clients/${seg(c.client_id)}`);
    say(r.disconnected ? `Disconnected ${c.client_id}.` : `${c.client_id} was not connected.`);
  } catch (err) {
    fail('Disconnect', err);
  }
}

// clientRows lays out the clients; the Replica column is there only when
// the broker runs as replicas (a client then says which one it is on).
function clientRows(u, replicas) {
  return u.clients.map((c) => [
    h('span', { class: 'name' }, c.name || '—'),
    h('code', {}, c.client_id),
    c.client_type,
    c.version || '—',
    labels(c.labels),
    c.connected ? h('span', { title: time(c.connected_at) }, time(c.connected_at), h('br'), h('span', { class: 'muted', 'data-since': c.connected_at }, ago(c.connected_at)))
      : h('span', { class: 'warn' }, 'away (reconnect grace)'),
    replicas ? h('code', { class: 'replica' }, c.replica || '—') : null,
    String(c.contexts),
    c.connected
      ? h('button', { type: 'button', class: 'danger', 'data-key': `disconnect:${c.user_id}:${c.client_id}`,
        'aria-label': `Disconnect client ${c.client_id} of ${c.user_id}`, onclick: () => disconnect(c) }, 'Disconnect')
      : '',
  ].filter((cell) => cell !== null));
}

function idleRows(u) {
  return u.idle.map((x) => [
    h('code', {}, x.client_id),
    h('code', {}, x.context_id),
    x.tab_id || '—',
    h('span', { class: 'title' }, x.title || '—'),
    h('span', { class: 'url' }, x.url || '—'),
    labels(x.labels),
    time(x.idle_since),
  ]);
}

function leaseRows(leases) {
  return leases.map((l) => [
    h('code', {}, l.client_id),
    h('code', {}, l.context_id),
    h('span', { class: 'task' }, l.task_id),
    String(l.epoch),
    h('span', { class: 'countdown', 'data-expires': l.expires_at }, remaining(l.expires_at)),
  ]);
}

function user(u, leases) {
  const replicas = u.clients.some((c) => c.replica);
  const id = `user-${u.user_id}`;
  return h('section', { class: 'user card', 'aria-labelledby': id },
    h('h2', { id }, u.user_id),
    h('ul', { class: 'counts', 'aria-label': `contexts of ${u.user_id} by state` },
      states(u.contexts).map(([k, label, n]) => h('li', { class: `count ${k}` }, h('span', { class: 'n' }, String(n)), ' ', label)),
      h('li', { class: 'count' }, h('span', { class: 'n' }, String(u.leases)), ' Leases'),
      h('li', { class: 'count' }, h('span', { class: 'n' }, String(u.waiters)), ' Waiting acquires')),
    table(`Clients of ${u.user_id}`,
      ['Name', 'Client id', 'Type', 'Version', 'Labels', 'Connected since', ...(replicas ? ['Replica'] : []), 'Contexts', ''],
      clientRows(u, replicas), 'No clients.'),
    table(`Leased contexts of ${u.user_id}`,
      ['Client', 'Context', 'Task', 'Epoch', 'Remaining'],
      leaseRows(leases.filter((l) => l.user_id === u.user_id)), 'No leased contexts.'),
    table(`Idle contexts of ${u.user_id}`,
      ['Client', 'Context', 'Tab', 'Title', 'URL', 'Labels', 'Idle since'],
      idleRows(u), 'No idle contexts.'));
}

export function render(_r, state) {
  const o = state.overview;
  if (!o) return h('section', {}, h('h1', {}, 'Overview'), h('p', { class: 'muted' }, 'Waiting for the broker…'));
  return h('section', { 'aria-labelledby': 'overview-title' },
    h('h1', { id: 'overview-title' }, 'Overview'),
    h('p', { class: 'muted' }, `${o.users.length} user${o.users.length === 1 ? '' : 's'}, ${o.leases.length} active lease${o.leases.length === 1 ? '' : 's'}. Updated ${time(o.now)}.`),
    o.users.length === 0 ? h('p', { class: 'muted' }, 'No client has connected yet.') : o.users.map((u) => user(u, o.leases)));
}
