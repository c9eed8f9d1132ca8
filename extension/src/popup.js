// The popup: connection state, worker tabs, and which task holds which tab.
// It reads the status the service worker publishes in storage.session, and
// messages the worker once so that a stopped worker starts (and connects).

import { holdLabel } from './lib/holds.js';
import { canReconnect, describeState, newerStatus, workerRows } from './lib/view.js';

const $ = (id) => document.getElementById(id);
let status = null;

function render() {
  const d = describeState(status);
  const pill = $('state');
  pill.textContent = d.label;
  pill.className = `pill ${d.cls}`;
  $('detail').textContent = d.detail;
  $('reconnect').hidden = !canReconnect(status);
  $('broker').textContent = status?.url ?? '—';
  $('user').textContent = status?.user_id ?? '—';
  $('client').textContent = status?.client_id ?? '—';
  $('pool').textContent = status?.pool_size != null ? `(pool of ${status.pool_size})` : '';
  const body = $('workers');
  body.replaceChildren();
  const rows = workerRows(status);
  if (rows.length === 0) {
    const tr = body.insertRow();
    const td = tr.insertCell();
    td.colSpan = 4;
    td.className = 'muted';
    td.textContent = 'none';
    return;
  }
  for (const r of rows) {
    const tr = body.insertRow();
    tr.dataset.tabId = r.tab;
    tr.insertCell().textContent = r.tab;
    const page = tr.insertCell();
    page.className = 'page';
    page.textContent = r.page;
    page.title = r.url;
    const task = tr.insertCell();
    if (r.task) {
      task.className = 'task';
      task.textContent = r.task;
      task.title = `epoch ${r.epoch}`;
    } else {
      task.className = 'muted';
      task.textContent = 'idle';
    }
    renderControl(tr.insertCell(), r);
  }
}

// Take control / Give back: a person's hold on a worker tab (DESIGN §10).
function renderControl(cell, r) {
  const live = status?.state === 'connected';
  const b = document.createElement('button');
  b.className = 'hold';
  if (r.held) {
    b.textContent = 'Give back';
    b.dataset.action = 'unhold';
    const note = document.createElement('div');
    note.className = 'muted held-state';
    note.textContent = holdLabel(r.held);
    cell.append(b, note);
  } else {
    b.textContent = 'Take control';
    b.dataset.action = 'hold';
    b.disabled = !live;
    cell.append(b);
  }
  b.addEventListener('click', () => control(b.dataset.action, r.tab));
}

/** accept shows s, unless the popup shows a newer status already. */
function accept(s) {
  if (!newerStatus(status, s)) return;
  status = s;
  render();
}

async function control(action, tab) {
  const minutes = Number($('hold-minutes').value) || 5;
  const fresh = await chrome.runtime.sendMessage({ type: action, tab_id: tab, minutes });
  if (fresh && !fresh.error) {
    accept(fresh);
  } else if (fresh?.error) {
    $('detail').textContent = fresh.error;
  }
}

async function load() {
  const { status: s } = await chrome.storage.session.get('status');
  if (s) accept(s);
  else render();
  try {
    const fresh = await chrome.runtime.sendMessage({ type: 'status' });
    if (fresh && !fresh.error) accept(fresh);
  } catch {
    // the worker is starting; its status arrives through storage
  }
}

chrome.storage.session.onChanged.addListener((changes) => {
  if (changes.status?.newValue) accept(changes.status.newValue);
});
$('reconnect').addEventListener('click', async () => {
  const fresh = await chrome.runtime.sendMessage({ type: 'reconnect' });
  if (fresh && !fresh.error) accept(fresh);
});
$('options').addEventListener('click', () => chrome.runtime.openOptionsPage());
// The "next attempt in" countdown.
setInterval(render, 1000);
load();
