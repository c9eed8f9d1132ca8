// History: a user's commands, by task or by command id, and one command's
// timeline, messages and captures. What history holds came from clients:
// it is shown as text, and captures only as images of a known raster type.
import { h, time, duration, table, replace } from './dom.js';
import { call, seg, APIError } from './api.js';
import { showImage, fail } from './app.js';

export const live = false;

const IMAGES = new Set(['image/png', 'image/jpeg', 'image/gif', 'image/webp']);
const BASE64 = /^[A-Za-z0-9+/]*={0,2}$/;

function go(view, params) {
  const q = new URLSearchParams();
  for (const [k, v] of Object.entries(params)) if (v) q.set(k, v);
  location.hash = `${view}?${q}`;
}

function form(params, users) {
  const submit = (ev) => {
    ev.preventDefault();
    const f = ev.target;
    const user = f.elements.user.value.trim();
    const id = f.elements.command.value.trim();
    if (id) go('command', { user, id });
    else go('history', { user, task: f.elements.task.value.trim() });
  };
  return h('form', { class: 'search', onsubmit: submit, 'aria-label': 'Search history' },
    h('label', { for: 'h-user' }, 'User'),
    h('input', { id: 'h-user', name: 'user', required: true, list: 'h-users', value: params.get('user') || '', autocomplete: 'off' }),
    h('datalist', { id: 'h-users' }, users.map((u) => h('option', { value: u }))),
    h('label', { for: 'h-task' }, 'Task id'),
    h('input', { id: 'h-task', name: 'task', value: params.get('task') || '', autocomplete: 'off' }),
    h('label', { for: 'h-command' }, 'or command id'),
    h('input', { id: 'h-command', name: 'command', value: params.get('id') || '', autocomplete: 'off' }),
    h('button', { type: 'submit' }, 'Search'));
}

async function list(out, user, task, cursor) {
  const q = new URLSearchParams({ limit: '50' });
  if (task) q.set('task_id', task);
  if (cursor) q.set('cursor', cursor);
  const page = await call('GET', `/api/v1/users/${seg(user)}/commands?${q}`);
  const rows = page.commands.map((c) => [
    h('a', { href: `#command?${new URLSearchParams({ user, id: c.command_id })}`, class: 'mono' }, c.command_id),
    c.name,
    h('span', { class: `state ${c.status}` }, c.status),
    c.task_id,
    h('code', {}, c.context_id),
    time(c.created_at),
    c.finished_at ? duration(Date.parse(c.finished_at) - Date.parse(c.created_at)) : '—',
  ]);
  out.appendChild(table(`Commands of ${user}${task ? ' for task ' + task : ''}`,
    ['Command id', 'Name', 'Status', 'Task', 'Context', 'Admitted', 'Took'], rows,
    cursor ? 'No more commands.' : 'No commands.'));
  if (page.next_cursor) {
    const more = h('button', { type: 'button', onclick: async () => {
      more.remove();
      try { await list(out, user, task, page.next_cursor); } catch (err) { fail('Loading more', err); }
    } }, 'More');
    out.appendChild(more);
  }
}

// timeline lists the stages a command went through, with when and how long
// each took from the one before.
function timeline(c) {
  const stages = [
    ['Admitted', c.created_at],
    ['Dispatched', c.dispatched_at],
    ['Acknowledged', c.acked_at],
    [`Terminal: ${c.finished_at ? c.status : 'not yet'}`, c.finished_at],
  ];
  const start = Date.parse(c.created_at);
  let prev = start;
  return h('ol', { class: 'timeline', 'aria-label': 'Timeline' }, stages.map(([name, at]) => {
    if (!at) return h('li', { class: 'pending' }, h('span', { class: 'stage' }, name), ' ', h('span', { class: 'muted' }, '—'));
    const t = Date.parse(at);
    const li = h('li', {},
      h('span', { class: 'stage' }, name), ' ',
      h('time', { datetime: at }, time(at)), ' ',
      h('span', { class: 'muted' }, t === start ? '' : `+${duration(t - prev)} (${duration(t - start)} in all)`));
    prev = t;
    return li;
  }));
}

function pretty(raw) {
  if (raw === undefined || raw === null) return '';
  try { return JSON.stringify(raw, null, 2); } catch { return String(raw); }
}

function messageBody(m, c) {
  if (m.kind === 'capture') {
    const data = typeof m.data === 'string' ? m.data : '';
    const bytes = Math.floor(data.length * 3 / 4);
    if (IMAGES.has(m.mime) && BASE64.test(data)) {
      const src = `data:${m.mime};base64,${data}`;
      const title = `Capture ${m.seq} of ${c.name} (${m.mime})`;
      return h('button', { type: 'button', class: 'thumb', 'aria-label': `Open ${title} full size`, onclick: () => showImage(src, title) },
        h('img', { src, alt: title }));
    }
    return h('span', {}, `${m.mime || 'unknown type'}, ${bytes} bytes (not shown)`);
  }
  const parts = [];
  if (m.name) parts.push(h('div', {}, h('strong', {}, m.name)));
  if (m.code || m.message) parts.push(h('div', { class: 'error' }, [m.code, m.message].filter(Boolean).join(': ')));
  if (m.data !== undefined) parts.push(h('pre', {}, pretty(m.data)));
  return parts;
}

function field(name, value) {
  return [h('dt', {}, name), h('dd', {}, value === undefined || value === null || value === '' ? '—' : value)];
}

async function command(out, user, id) {
  const { command: c } = await call('GET', `/api/v1/users/${seg(user)}/commands/${seg(id)}`);
  const d = c.delivery;
  out.appendChild(h('article', { class: 'card command', 'aria-labelledby': 'cmd-title' },
    h('h2', { id: 'cmd-title' }, `${c.name} `, h('span', { class: `state ${c.status}` }, c.status)),
    h('dl', { class: 'fields' },
      field('Command id', h('code', {}, c.command_id)),
      field('Trace id', h('code', { class: 'trace' }, c.trace_id)),
      field('User', c.user_id),
      field('Task', h('a', { href: `#history?${new URLSearchParams({ user: c.user_id, task: c.task_id })}` }, c.task_id)),
      field('Context', h('span', {}, h('code', {}, c.context_id), ' on ', h('code', {}, c.client_id))),
      field('Epoch', String(c.epoch)),
      field('Response mode', c.response_mode),
      field('Error', c.error ? [c.error.code, c.error.message].filter(Boolean).join(': ') : ''),
      field('Webhook', d ? `${d.delivered ? 'delivered' : 'not delivered'} after ${d.attempts} attempt${d.attempts === 1 ? '' : 's'}${d.last_error ? '; last error: ' + d.last_error : ''} — ${d.url}` : 'none')),
    h('h3', {}, 'Timeline'),
    timeline(c),
    h('h3', {}, 'Parameters'),
    h('pre', {}, pretty(c.params) || '—'),
    h('h3', {}, 'Messages'),
    table(`Messages of ${c.command_id}`, ['Seq', 'Kind', 'At', 'Content'],
      c.messages.map((m) => [String(m.seq), m.late ? `${m.kind} (late)` : m.kind, time(m.at), messageBody(m, c)]),
      'No messages.')));
}

export function render(r, state) {
  const users = state.overview ? state.overview.users.map((u) => u.user_id) : [];
  const out = h('div', { id: 'history-results', 'aria-live': 'polite' });
  const user = r.params.get('user');
  const title = r.command ? 'Command' : 'History';
  const load = async () => {
    try {
      if (r.command) await command(out, user, r.params.get('id'));
      else if (user) await list(out, user, r.params.get('task'));
    } catch (err) {
      replace(out, h('p', { class: 'error', role: 'alert' }, err instanceof APIError ? `${err.code}: ${err.message}` : String(err)));
    }
  };
  load();
  return h('section', { 'aria-labelledby': 'history-title' },
    h('h1', { id: 'history-title' }, title),
    form(r.params, users),
    out);
}
