// Wire protocol v1 of the Cheetah broker, as the extension speaks it: frame
// builders, a tolerant parser, close-code meanings and size guards. No
// browser APIs: the Node unit tests load this file as it is.

export const PROTOCOL_VERSION = 1;

// The broker's default for max_message_bytes, used until a welcome says
// otherwise.
export const DEFAULT_MAX_MESSAGE_BYTES = 4 * 1024 * 1024;

// Close codes the broker uses (DESIGN §4).
export const CLOSE = Object.freeze({
  GOING_AWAY: 1001,
  MALFORMED: 4400,
  UNAUTHORIZED: 4401,
  FORBIDDEN: 4403,
  TIMEOUT: 4408,
  REPLACED: 4409,
  TOO_LARGE: 4413,
  RATE_LIMITED: 4429,
});

// After these a retry cannot succeed until something changes: the key is bad
// or revoked, an admin disconnected this client, or another connection with
// the same client_id took over (reconnecting would only evict it in turn).
const PERMANENT = new Map([
  [CLOSE.UNAUTHORIZED, 'the broker refused the client key'],
  [CLOSE.FORBIDDEN, 'disconnected by an admin, or the key was revoked'],
  [CLOSE.REPLACED, 'another connection with the same client id took over'],
]);

/** isPermanentClose reports whether reconnecting after code is pointless. */
export function isPermanentClose(code) {
  return PERMANENT.has(code);
}

/** closeReason describes a close code for people. */
export function closeReason(code) {
  if (PERMANENT.has(code)) return PERMANENT.get(code);
  switch (code) {
    case 1000: return 'closed';
    case 1001: return 'the broker is shutting down';
    case 1006: return 'the connection was lost';
    case CLOSE.MALFORMED: return 'the broker refused a malformed frame';
    case CLOSE.TIMEOUT: return 'the broker heard nothing for too long';
    case CLOSE.TOO_LARGE: return 'a frame was larger than the broker allows';
    case CLOSE.RATE_LIMITED: return 'too many frames';
    default: return `closed with ${code}`;
  }
}

// Error codes the extension puts in error frames. The first four are the
// ones DESIGN §7 names; the rest say what else went wrong.
export const CODES = Object.freeze({
  INVALID_PARAMS: 'invalid_params',
  NO_SUCH_ELEMENT: 'no_such_element',
  NAVIGATION_FAILED: 'navigation_failed',
  TIMEOUT: 'timeout',
  UNSUPPORTED_COMMAND: 'unsupported_command',
  NO_SUCH_TAB: 'no_such_tab',
  NOT_SCRIPTABLE: 'not_scriptable',
  NO_SUCH_FRAME: 'no_such_frame',
  NOT_ENABLED: 'not_enabled',
  CANCELLED: 'cancelled',
  TOO_LARGE: 'too_large',
  COMMAND_FAILED: 'command_failed',
});

/** CommandError is a failure that becomes an error frame with its code. */
export class CommandError extends Error {
  constructor(code, message, data) {
    super(message);
    this.name = 'CommandError';
    this.code = code;
    this.data = data;
  }
}

const ID_PATTERN = /^[A-Za-z0-9][A-Za-z0-9_.:-]{0,127}$/;

/** validId reports whether s is a valid client or context id. */
export function validId(s) {
  return typeof s === 'string' && ID_PATTERN.test(s);
}

/** contextIdForTab names the context of a browser tab. */
export function contextIdForTab(tabId) {
  return `tab-${tabId}`;
}

/** tabIdForContext is the inverse of contextIdForTab, or null. */
export function tabIdForContext(contextId) {
  const m = /^tab-(\d+)$/.exec(String(contextId));
  return m ? Number(m[1]) : null;
}

/** newClientId makes a client id that is stable once stored. */
export function newClientId(randomBytes) {
  const bytes = randomBytes(8);
  return 'ext-' + Array.from(bytes, (b) => b.toString(16).padStart(2, '0')).join('');
}

/** The broker's client WebSocket path (DESIGN §4). */
export const CLIENT_PATH = '/ws/v1/client';

/**
 * normalizeBrokerURL turns what a person types into the client WebSocket URL:
 * "localhost:8420", "http://host:8420", "https://broker.example" and
 * "wss://host/ws/v1/client" all work. http maps to ws and https to wss (TLS).
 * An http(s) URL is the broker's base, as `cheetah agent --url` takes it:
 * a path on it is a prefix (a proxy that serves the broker under /cheetah)
 * and /ws/v1/client is added unless it is there already. A ws(s) URL with a
 * path is used as it is. It throws on anything that is not http(s) or ws(s).
 */
export function normalizeBrokerURL(input) {
  let s = String(input ?? '').trim();
  if (s === '') throw new Error('the broker URL is empty');
  if (!/^[a-z][a-z0-9+.-]*:\/\//i.test(s)) s = 'http://' + s;
  let u;
  try {
    u = new URL(s);
  } catch {
    throw new Error(`"${input}" is not a URL`);
  }
  let base = false;
  switch (u.protocol) {
    case 'http:': u.protocol = 'ws:'; base = true; break;
    case 'https:': u.protocol = 'wss:'; base = true; break;
    case 'ws:': case 'wss:': break;
    default: throw new Error(`the broker URL must start with http, https, ws or wss, not ${u.protocol}`);
  }
  if (u.hostname === '') throw new Error(`"${input}" has no host`);
  if (u.pathname === '' || u.pathname === '/') {
    u.pathname = CLIENT_PATH;
  } else if (base && !u.pathname.endsWith(CLIENT_PATH)) {
    u.pathname = u.pathname.replace(/\/+$/, '') + CLIENT_PATH;
  }
  u.hash = '';
  return u.toString();
}

/**
 * cleartextWarning says why a client WebSocket URL (as normalizeBrokerURL
 * returns it) is unsafe: a ws:// URL to a host other than this machine
 * sends the client key in clear. It returns '' for wss:// and for loopback.
 */
export function cleartextWarning(wsUrl) {
  let u;
  try {
    u = new URL(wsUrl);
  } catch {
    return '';
  }
  if (u.protocol !== 'ws:') return '';
  const host = u.hostname.replace(/^\[|\]$/g, '').toLowerCase();
  if (host === 'localhost' || host.endsWith('.localhost') || host === '::1' || /^127\.\d+\.\d+\.\d+$/.test(host)) return '';
  return `${u.host} is not this machine and the connection is not encrypted: the client key would travel in clear. Use https:// (or wss://) with a broker that serves TLS (cheetah serve --tls-cert) or a TLS proxy in front of it.`;
}

/** parseLabels reads "k=v" pairs separated by commas or new lines. */
export function parseLabels(text) {
  const labels = {};
  for (const part of String(text ?? '').split(/[,\n]/)) {
    const p = part.trim();
    if (p === '') continue;
    const eq = p.indexOf('=');
    if (eq <= 0) throw new Error(`label "${p}" is not key=value`);
    const k = p.slice(0, eq).trim();
    const v = p.slice(eq + 1).trim();
    if (k === '' || k.length > 64) throw new Error(`label key "${k}" must be 1 to 64 characters`);
    if (v.length > 256) throw new Error(`label "${k}" has a value longer than 256 characters`);
    labels[k] = v;
  }
  if (Object.keys(labels).length > 32) throw new Error('at most 32 labels');
  return labels;
}

/** formatLabels is the inverse of parseLabels. */
export function formatLabels(labels) {
  return Object.entries(labels ?? {}).map(([k, v]) => `${k}=${v}`).join(', ');
}

/** helloFrame is the first frame of every connection. */
export function helloFrame({ token, clientId, name, version, labels, maxContexts, effects }) {
  const f = {
    type: 'hello', protocol: PROTOCOL_VERSION, token, client_id: clientId,
    client_type: 'browser',
  };
  if (name) f.name = name;
  if (version) f.version = version;
  if (labels && Object.keys(labels).length > 0) f.labels = labels;
  if (Number.isInteger(maxContexts) && maxContexts >= 0) f.capacity = { max_contexts: maxContexts };
  if (effects && Object.keys(effects).length > 0) f.effects = effects;
  return f;
}

export const pingFrame = () => ({ type: 'ping' });
export const ackFrame = (commandId) => ({ type: 'ack', command_id: commandId });
export const resultFrame = (commandId, data) => ({ type: 'result', command_id: commandId, data: data ?? {} });
export const captureFrame = (commandId, mime, base64) => ({ type: 'capture', command_id: commandId, mime, data: base64 });
export const progressFrame = (commandId, data) => ({ type: 'progress', command_id: commandId, data });
export const eventFrame = (commandId, name, data) => ({ type: 'event', command_id: commandId, name, data: data ?? {} });

/** errorFrame is a command's failed terminal message. */
export function errorFrame(commandId, code, message, data) {
  const f = { type: 'error', command_id: commandId, code: code || CODES.COMMAND_FAILED };
  if (message) f.message = String(message);
  if (data !== undefined) f.data = data;
  return f;
}

// Bounds on what a state report says about one tab: a data: URL can be
// megabytes long, and the broker only needs to show it.
export const MAX_URL_CHARS = 2048;
export const MAX_TITLE_CHARS = 512;

/** stateFrame lists the client's contexts; it replaces the previous report. */
export function stateFrame(contexts) {
  return { type: 'state', contexts };
}

/**
 * contextReport describes one worker tab in a state frame. requestId, when
 * given, names the create_context the tab was opened for (DESIGN §10).
 */
export function contextReport(tab, labels, requestId) {
  const r = { context_id: contextIdForTab(tab.id), tab_id: String(tab.id), owner: 'worker' };
  if (tab.url) r.url = truncateChars(tab.url, MAX_URL_CHARS);
  if (tab.title) r.title = truncateChars(tab.title, MAX_TITLE_CHARS);
  if (labels && Object.keys(labels).length > 0) r.labels = labels;
  if (requestId) r.request_id = requestId;
  return r;
}

/**
 * createFailedFrame answers a create_context the extension cannot honour
 * (DESIGN §10): the acquire waiting for it fails creation_failed.
 */
export function createFailedFrame(requestId, code, message) {
  const f = { type: 'create_failed', request_id: requestId, code };
  if (message) f.message = String(message);
  return f;
}

function truncateChars(s, n) {
  return s.length <= n ? s : s.slice(0, n);
}

/**
 * parseFrame decodes one frame from the broker. It returns {frame} or
 * {error}; it never throws. Only the fields the extension relies on are
 * checked, so that a newer broker's additions pass through.
 */
export function parseFrame(text) {
  let f;
  try {
    f = JSON.parse(text);
  } catch {
    return { error: 'not JSON' };
  }
  if (f === null || typeof f !== 'object' || Array.isArray(f)) return { error: 'not an object' };
  if (typeof f.type !== 'string' || f.type === '') return { error: 'no type' };
  switch (f.type) {
    case 'welcome':
      if (typeof f.user_id !== 'string') return { error: 'welcome without user_id' };
      break;
    case 'command':
      if (typeof f.command_id !== 'string' || f.command_id === '') return { error: 'command without command_id' };
      if (typeof f.name !== 'string') return { error: 'command without name' };
      break;
    case 'cancel':
      if (typeof f.command_id !== 'string') return { error: 'cancel without command_id' };
      break;
    case 'assignment':
      if (typeof f.context_id !== 'string' || typeof f.state !== 'string') return { error: 'assignment without context_id or state' };
      break;
    case 'create_context':
      if (!validId(f.request_id)) return { error: 'create_context without a valid request_id' };
      if (f.url !== undefined && typeof f.url !== 'string') return { error: 'create_context with a url that is not a string' };
      break;
    default:
  }
  return { frame: f };
}

/** utf8Length is the number of bytes s takes in UTF-8. */
export function utf8Length(s) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x80) n += 1;
    else if (c < 0x800) n += 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      n += 4;
      i++;
    } else n += 3; // the rest of the BMP, and lone surrogates as U+FFFD
  }
  return n;
}

/**
 * truncateUtf8 cuts s to at most maxBytes bytes of UTF-8 without splitting a
 * character, and says whether it cut anything.
 */
export function truncateUtf8(s, maxBytes) {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    let w;
    let step = 1;
    if (c < 0x80) w = 1;
    else if (c < 0x800) w = 2;
    else if (c >= 0xd800 && c <= 0xdbff && i + 1 < s.length && (s.charCodeAt(i + 1) & 0xfc00) === 0xdc00) {
      w = 4;
      step = 2;
    } else w = 3;
    if (n + w > maxBytes) return { text: s.slice(0, i), bytes: n, truncated: true };
    n += w;
    i += step - 1;
  }
  return { text: s, bytes: n, truncated: false };
}

/**
 * encodeFrame serializes f. A frame larger than maxBytes would make the broker
 * close the connection (4413), so a command's terminal frame (result or
 * error) is replaced by an error frame that says so, and anything else is
 * dropped (null). Callers that can fail a command earlier, such as a
 * screenshot too large to send, check with frameFits first.
 */
export function encodeFrame(f, maxBytes = DEFAULT_MAX_MESSAGE_BYTES) {
  const s = JSON.stringify(f);
  if (utf8Length(s) <= maxBytes) return s;
  if (f.command_id && (f.type === 'result' || f.type === 'error')) {
    return JSON.stringify(errorFrame(f.command_id, CODES.TOO_LARGE,
      `the ${f.type} would be larger than the broker's max_message_bytes (${maxBytes})`));
  }
  return null;
}

/** frameFits reports whether f encodes to at most maxBytes bytes. */
export function frameFits(f, maxBytes = DEFAULT_MAX_MESSAGE_BYTES) {
  return utf8Length(JSON.stringify(f)) <= maxBytes;
}
