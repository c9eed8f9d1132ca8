// Calls to the broker. The session cookie goes with every request; the CSRF
// token, held in memory only, goes with every request that changes anything.

let csrf = '';
let onSignedOut = () => {};

export function setSession(info) { csrf = info ? info.csrf_token : ''; }
export function whenSignedOut(f) { onSignedOut = f; }

export class APIError extends Error {
  constructor(status, body) {
    const e = (body && body.error) || {};
    super(e.message || `HTTP ${status}`);
    this.status = status;
    this.code = e.code || '';
    this.reason = e.reason || '';
  }
}

// call sends one request and returns the decoded answer.
export async function call(method, path, body) {
  const headers = { Accept: 'application/json' };
  if (method !== 'GET') headers['X-CSRF-Token'] = csrf;
  const init = { method, headers, credentials: 'same-origin', cache: 'no-store' };
  if (body !== undefined) {
    headers['Content-Type'] = 'application/json';
    init.body = JSON.stringify(body);
  }
  const r = await fetch(path, init);
  let data = null;
  try { data = await r.json(); } catch { data = null; }
  if (!r.ok) {
    const err = new APIError(r.status, data);
    if (r.status === 401 && path !== '/ui/api/session') onSignedOut();
    throw err;
  }
  return data;
}

// seg escapes one path segment.
export function seg(s) { return encodeURIComponent(s); }
