// The options page: broker URL, client key, pool size, extra tabs, name, labels and the
// evaluate opt-in, kept in chrome.storage.local. The broker URL is checked
// by connecting before it is saved. The service worker notices the change
// and reconnects.

import { checkPoolSize } from './lib/pool.js';
import { cleartextWarning, formatLabels, normalizeBrokerURL, parseLabels } from './lib/protocol.js';
import { probeBroker } from './lib/probe.js';
import { describeState, newerStatus } from './lib/view.js';

const $ = (id) => document.getElementById(id);
let lastFailed = null; // the URL whose check failed on the last save

// shown is the status the page shows (see newerStatus).
let shown = null;

function show(status) {
  if (!newerStatus(shown, status)) return;
  shown = status;
  const d = describeState(status, Date.now(), { onOptions: true });
  $('state').textContent = d.label;
  $('state').className = `pill ${d.cls}`;
  $('detail').textContent = d.detail;
  if (status?.client_id) $('client-id').textContent = status.client_id;
}

function say(text, ok) {
  const m = $('message');
  m.textContent = text;
  m.className = ok ? 'ok' : 'error';
}

async function load() {
  $('origin').textContent = location.origin;
  const c = await chrome.storage.local.get(['brokerUrl', 'clientKey', 'poolSize', 'extraTabs', 'clientId', 'name', 'labels', 'allowEvaluate']);
  $('allow-evaluate').checked = c.allowEvaluate === true;
  $('broker-url').value = c.brokerUrl ?? '';
  $('client-key').value = c.clientKey ?? '';
  $('pool-size').value = String(c.poolSize ?? 2);
  $('extra-tabs').value = String(c.extraTabs ?? 0);
  $('name').value = c.name ?? '';
  $('labels').value = formatLabels(c.labels);
  if (c.clientId) $('client-id').textContent = c.clientId;
  const { status } = await chrome.storage.session.get('status');
  show(status);
  try {
    const fresh = await chrome.runtime.sendMessage({ type: 'status' });
    if (fresh && !fresh.error) show(fresh);
  } catch {
    // the worker is starting
  }
}

$('form').addEventListener('submit', async (ev) => {
  ev.preventDefault();
  const brokerUrl = $('broker-url').value.trim();
  const clientKey = $('client-key').value.trim();
  let poolSize;
  let extraTabs;
  let labels;
  let warning;
  let wsUrl;
  try {
    wsUrl = normalizeBrokerURL(brokerUrl);
    warning = cleartextWarning(wsUrl);
    if (clientKey === '') throw new Error('paste a client key');
    poolSize = checkPoolSize($('pool-size').value);
    extraTabs = checkPoolSize($('extra-tabs').value, 'the number of extra tabs');
    labels = parseLabels($('labels').value);
  } catch (e) {
    say(e.message, false);
    return;
  }
  // Connect before saving: a wrong path or a broker that is not there is
  // said here, not discovered later. A second save of the same URL keeps
  // it anyway (a broker that is down for now).
  say('Checking the broker…', true);
  const probe = await probeBroker(wsUrl, { WebSocket, fetch });
  if (!probe.ok && lastFailed !== wsUrl) {
    lastFailed = wsUrl;
    say(`Not saved: ${probe.message}. Save again to keep this URL anyway.`, false);
    return;
  }
  lastFailed = null;
  const next = { brokerUrl, clientKey, poolSize, extraTabs, name: $('name').value.trim(), labels, allowEvaluate: $('allow-evaluate').checked };
  const prev = await chrome.storage.local.get(Object.keys(next));
  const same = Object.keys(next).every((k) => JSON.stringify(prev[k]) === JSON.stringify(next[k]));
  await chrome.storage.local.set(next);
  // A change reconnects by itself; saving the same settings again is a
  // request to try now (after a refused key was fixed on the broker, say).
  if (same) await chrome.runtime.sendMessage({ type: 'reconnect' }).catch(() => {});
  if (!probe.ok) say(`Saved, though ${probe.message}`, false);
  else if (warning) say(`Saved, but ${warning}`, false);
  else say('Saved.', true);
});

chrome.storage.session.onChanged.addListener((changes) => {
  if (changes.status?.newValue) show(changes.status.newValue);
});
load();
