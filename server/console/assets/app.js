// The console's entry point: sign-in, the live overview stream, navigation
// between the views, and the shared confirmation and status helpers.
import { call, setSession, whenSignedOut, APIError } from './api.js';
import { replace, duration } from './dom.js';
import * as overview from './overview.js';
import * as leases from './leases.js';
import * as history from './history.js';
import * as keys from './keys.js';
import * as quotas from './quotas.js';

const views = { overview, leases, history, keys, quotas };
const $ = (id) => document.getElementById(id);

// state is what the views share: the latest overview snapshot and the
// offset from this browser's clock to the broker's.
export const state = { overview: null, offset: 0, session: null };

let stream = null;

// say puts a message in the status line, read out by screen readers.
export function say(text, isError) {
  const s = $('status');
  s.textContent = text;
  s.classList.toggle('error', !!isError);
}

// fail says what went wrong with an action.
export function fail(what, err) {
  const detail = err instanceof APIError ? `${err.code}${err.reason ? ' (' + err.reason + ')' : ''}: ${err.message}` : String(err);
  say(`${what} failed: ${detail}`, true);
}

// confirm asks a yes/no question in a modal dialog; resolves to a boolean.
export function confirm(title, text, action) {
  const d = $('confirm');
  $('confirm-title').textContent = title;
  $('confirm-text').textContent = text;
  $('confirm-ok').textContent = action;
  d.returnValue = '';
  return new Promise((resolve) => {
    d.addEventListener('close', () => resolve(d.returnValue === 'ok'), { once: true });
    d.showModal();
    $('confirm-cancel').focus();
  });
}

// showImage opens a capture full size.
export function showImage(src, title) {
  $('viewer-title').textContent = title;
  const img = $('viewer-img');
  img.src = src;
  img.alt = title;
  $('viewer').showModal();
  $('viewer-close').focus();
}

// now is the broker's clock, as well as this page knows it.
export function now() { return Date.now() + state.offset; }

function route() {
  const hash = location.hash.replace(/^#/, '');
  const [name, query] = hash.split('?');
  const params = new URLSearchParams(query || '');
  if (name === 'command') return { view: history, name: 'history', params, command: true };
  const v = views[name] ? name : 'overview';
  return { view: views[v], name: v, params };
}

// render draws the current view, keeping keyboard focus on the control
// that had it when the view is redrawn by a live update.
export function render(live) {
  if (!state.session) return;
  const r = route();
  if (live && !r.view.live) return;
  r.live = live;
  const active = document.activeElement;
  const key = active && active.dataset ? active.dataset.key : undefined;
  for (const a of document.querySelectorAll('#nav a')) {
    if (a.dataset.view === r.name) a.setAttribute('aria-current', 'page');
    else a.removeAttribute('aria-current');
  }
  const el = $('view');
  const out = r.view.render(r, state);
  if (out instanceof Node) replace(el, out);
  if (key) {
    for (const c of el.querySelectorAll('[data-key]')) {
      if (c.dataset.key === key) { c.focus(); break; }
    }
  }
}

function showSignIn(message, isError) {
  state.session = null;
  setSession(null);
  if (stream) { stream.close(); stream = null; }
  $('nav').hidden = true;
  $('who').hidden = true;
  $('view').hidden = true;
  replace($('view'));
  $('signin').hidden = false;
  const note = $('signin-error');
  note.textContent = message || '';
  note.className = isError ? 'error' : 'note';
  $('signin-key').focus();
}

function signedIn(info) {
  state.session = info;
  setSession(info);
  $('signin').hidden = true;
  $('nav').hidden = false;
  $('who').hidden = false;
  $('who-name').textContent = `Signed in as ${info.key_name || info.key_id}`;
  $('view').hidden = false;
  connect();
  render(false);
}

function setLive(text) {
  const l = $('live');
  l.textContent = text;
  l.classList.toggle('on', text === 'live');
}

// connect opens the overview's event stream.
function connect() {
  if (stream) stream.close();
  setLive('connecting');
  stream = new EventSource('/ui/api/events');
  stream.addEventListener('overview', (e) => {
    const o = JSON.parse(e.data);
    state.offset = Date.parse(o.now) - Date.now();
    state.overview = o;
    setLive('live');
    render(true);
  });
  stream.addEventListener('signed-out', () => showSignIn('The session ended. Sign in again.'));
  stream.addEventListener('error', async () => {
    setLive('reconnecting');
    if (stream && stream.readyState === EventSource.CLOSED) {
      try {
        await call('GET', '/ui/api/session');
        setTimeout(connect, 2000);
      } catch (err) {
        if (err instanceof APIError && err.status === 401) showSignIn('The session ended. Sign in again.');
      }
    }
  });
}

async function signIn(ev) {
  ev.preventDefault();
  const input = $('signin-key');
  const key = input.value;
  input.value = ''; // the key is not kept in the page, not even in the field
  try {
    const info = await call('POST', '/ui/api/session', { key });
    $('signin-error').textContent = '';
    signedIn(info);
  } catch (err) {
    const note = $('signin-error');
    note.textContent = err instanceof APIError ? err.message : String(err);
    note.className = 'error';
    input.focus();
  }
}

async function signOut() {
  try {
    await call('DELETE', '/ui/api/session');
  } catch (err) {
    if (!(err instanceof APIError && err.status === 401)) { fail('Sign out', err); return; }
  }
  location.hash = '';
  showSignIn('Signed out.');
}

// remaining says how long until an RFC 3339 time, by the broker's clock.
export function remaining(t) {
  const left = Date.parse(t) - now();
  return left > 0 ? formatLeft(left) : 'expired';
}

function tick() {
  for (const el of document.querySelectorAll('[data-expires]')) el.textContent = remaining(el.dataset.expires);
  for (const el of document.querySelectorAll('[data-since]')) el.textContent = ago(el.dataset.since);
}

// ago says how long ago an RFC 3339 time was, by the broker's clock.
export function ago(t) {
  const ms = now() - Date.parse(t);
  return ms < 5000 ? 'just now' : `${duration(ms)} ago`;
}

export function formatLeft(ms) {
  const s = Math.ceil(ms / 1000);
  const m = Math.floor(s / 60);
  return m > 0 ? `${m}m ${String(s % 60).padStart(2, '0')}s` : `${s}s`;
}

async function start() {
  whenSignedOut(() => showSignIn('The session ended. Sign in again.'));
  $('signin-form').addEventListener('submit', signIn);
  $('sign-out').addEventListener('click', signOut);
  $('skip').addEventListener('click', (e) => { e.preventDefault(); $('main').focus(); });
  window.addEventListener('hashchange', () => { say(''); render(false); $('main').focus(); });
  setInterval(tick, 1000);
  try {
    signedIn(await call('GET', '/ui/api/session'));
  } catch {
    showSignIn('');
  }
}

start();
