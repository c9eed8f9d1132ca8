// Leases: every active lease with a live countdown, and Revoke. The broker's
// admin views never carry a lease token, and neither does this page.
import { h, time, table } from './dom.js';
import { call, seg } from './api.js';
import { confirm, say, fail, remaining } from './app.js';

export const live = true;

async function revoke(l) {
  const ok = await confirm('Revoke lease',
    `Revoke the lease of task ${l.task_id} on ${l.context_id} (${l.client_id}, ${l.user_id}), epoch ${l.epoch}? Its holder's next use fails with lease_lost (revoked); work already dispatched keeps running.`,
    'Revoke');
  if (!ok) return;
  try {
    const r = await call('POST', `/api/v1/admin/users/${seg(l.user_id)}/clients/${seg(l.client_id)}/contexts/${seg(l.context_id)}/revoke`);
    say(r.revoked ? `Revoked the lease of ${l.task_id} on ${l.context_id}.` : `No lease on ${l.context_id} any more.`);
  } catch (err) {
    fail('Revoke', err);
  }
}

export function render(_r, state) {
  const o = state.overview;
  const ls = o ? o.leases : [];
  const rows = ls.map((l) => [
    h('span', { class: 'task' }, l.task_id),
    l.user_id,
    h('span', {}, h('code', {}, l.context_id), ' on ', h('code', {}, l.client_id), ` (${l.client_type})`),
    String(l.epoch),
    `${l.ttl_s} s`,
    l.renew_on_use ? 'on use' : 'no',
    l.held ? h('span', { class: 'held' }, `held (${l.held.state}) since `, time(l.held.since)) : '—',
    time(l.expires_at),
    h('span', { class: 'countdown', 'data-expires': l.expires_at, role: 'timer', 'aria-live': 'off' },
      remaining(l.expires_at)),
    h('button', { type: 'button', class: 'danger', 'data-key': `revoke:${l.user_id}:${l.client_id}:${l.context_id}:${l.epoch}`,
      'aria-label': `Revoke the lease of task ${l.task_id} on ${l.context_id}`, onclick: () => revoke(l) }, 'Revoke'),
  ]);
  return h('section', { 'aria-labelledby': 'leases-title' },
    h('h1', { id: 'leases-title' }, 'Leases'),
    h('p', { class: 'muted' }, 'A send renews its lease when it renews on use; a command in flight, or a person holding the context, keeps it.'),
    table('Active leases', ['Task', 'User', 'Context', 'Epoch', 'TTL', 'Renews', 'Held', 'Expires at', 'Remaining', ''], rows, 'No active leases.'));
}
