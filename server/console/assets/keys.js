// Keys: list, create (the secret is shown once), revoke.
import { h, time, table, replace } from './dom.js';
import { call, seg } from './api.js';
import { confirm, say, fail, render as redraw } from './app.js';

export const live = false;

let created = null; // the key made last, shown until the view is left

async function copy(text, what) {
  try {
    await navigator.clipboard.writeText(text);
    say(`${what} copied to the clipboard.`);
  } catch {
    say(`Copying failed: select the ${what.toLowerCase()} and copy it.`, true);
  }
}

function secret(label, id, value) {
  return h('div', { class: 'secret' },
    h('label', { for: id }, label),
    h('input', { id, readonly: true, value, spellcheck: 'false', autocomplete: 'off' }),
    h('button', { type: 'button', onclick: () => copy(value, label) }, `Copy ${label.toLowerCase()}`));
}

function createdPanel(c) {
  return h('div', { class: 'card created', role: 'region', 'aria-labelledby': 'created-title' },
    h('h2', { id: 'created-title' }, `Key ${c.id} (${c.kind}) created`),
    h('p', { class: 'warn' }, 'This is the only time the key is shown. Copy it now.'),
    secret('Key', 'created-key', c.key),
    c.webhook_secret ? secret('Webhook secret', 'created-whsec', c.webhook_secret) : null,
    h('button', { type: 'button', onclick: () => { created = null; redraw(false); } }, 'Done'));
}

async function create(ev) {
  ev.preventDefault();
  const f = ev.target;
  const body = { kind: f.elements.kind.value, name: f.elements.name.value };
  if (body.kind === 'client') body.user_id = f.elements.user.value.trim();
  try {
    created = await call('POST', '/api/v1/admin/keys', body);
    f.reset();
    redraw(false);
    const k = document.getElementById('created-key');
    if (k) k.focus();
  } catch (err) {
    fail('Creating the key', err);
  }
}

async function revoke(k) {
  const ok = await confirm('Revoke key', `Revoke ${k.kind} key ${k.id} (${k.name || 'no name'})? Clients connected with it are disconnected with 4403.`, 'Revoke');
  if (!ok) return;
  try {
    const r = await call('DELETE', `/api/v1/admin/keys/${seg(k.id)}`);
    say(`Revoked key ${k.id}; ${r.disconnected} client${r.disconnected === 1 ? '' : 's'} disconnected.`);
    redraw(false);
  } catch (err) {
    fail('Revoking the key', err);
  }
}

async function load(out) {
  try {
    const { keys } = await call('GET', '/api/v1/admin/keys');
    keys.sort((a, b) => (a.created_at < b.created_at ? 1 : -1));
    replace(out, table('API keys', ['Id', 'Kind', 'User', 'Name', 'Created', 'State', ''], keys.map((k) => [
      h('code', {}, k.id), k.kind, k.user_id || '—', k.name || '—', time(k.created_at),
      k.revoked_at ? `revoked ${time(k.revoked_at)}` : 'active',
      k.revoked_at ? '' : h('button', { type: 'button', class: 'danger', 'data-key': `revoke-key:${k.id}`,
        'aria-label': `Revoke key ${k.id}`, onclick: () => revoke(k) }, 'Revoke'),
    ]), 'No keys in the store.'));
  } catch (err) {
    fail('Listing keys', err);
  }
}

export function render() {
  const list = h('div', { id: 'key-list' });
  load(list);
  const userField = h('input', { id: 'k-user', name: 'user', autocomplete: 'off', placeholder: 'usr_…' });
  const kind = h('select', { id: 'k-kind', name: 'kind', onchange: () => { userField.disabled = kind.value !== 'client'; } },
    h('option', { value: 'client' }, 'client (one user, WebSocket)'),
    h('option', { value: 'app' }, 'app (the back end)'),
    h('option', { value: 'admin' }, 'admin'));
  return h('section', { 'aria-labelledby': 'keys-title' },
    h('h1', { id: 'keys-title' }, 'Keys'),
    created ? createdPanel(created) : null,
    h('form', { class: 'search', onsubmit: create, 'aria-label': 'Create a key' },
      h('label', { for: 'k-kind' }, 'Kind'), kind,
      h('label', { for: 'k-user' }, 'User id'), userField,
      h('label', { for: 'k-name' }, 'Name'), h('input', { id: 'k-name', name: 'name', autocomplete: 'off' }),
      h('button', { type: 'submit' }, 'Create key')),
    list);
}
