// The browser command catalogue (DESIGN §7): each command's params, how
// they are checked, and its effect (declared in hello.effects). Pure: no
// browser APIs.

import { CODES, CommandError } from './protocol.js';

// extract returns at most this much unless max_bytes says otherwise; the
// broker's max_message_bytes bounds it further.
export const DEFAULT_EXTRACT_BYTES = 1024 * 1024;
export const MAX_SELECTOR_CHARS = 4096;
export const MAX_TYPE_CHARS = 1024 * 1024;
export const MAX_URL_CHARS = 64 * 1024;
export const MAX_TIMEOUT_MS = 3600 * 1000;
export const MAX_KEYS_CHARS = 256;
export const MAX_EXPRESSION_CHARS = 1024 * 1024;
export const MAX_PARSE_FIELDS = 256;
export const MAX_PARSE_DEPTH = 8;
export const MAX_COOKIES = 1000;
export const MAX_VALUES = 1000;
export const MAX_FILES = 100;
export const MAX_SCROLL_PX = 10_000_000;

export const WAIT_UNTIL = Object.freeze(['load', 'domcontentloaded', 'networkidle']);
export const WAIT_STATES = Object.freeze(['attached', 'visible', 'hidden', 'detached']);
export const EVENT_KINDS = Object.freeze(['console', 'network', 'dialog', 'download', 'popup']);
export const SAME_SITE = Object.freeze(['no_restriction', 'lax', 'strict', 'unspecified']);

const O = 'observe';
const M = 'mutate';

// Each command's params and effect. Anything not listed is invalid_params,
// so that a typo ("selecter") fails loudly instead of being ignored.
const CATALOGUE = {
  navigate: { effect: M, params: ['url', 'wait_until', 'timeout_ms'] },
  reload: { effect: M, params: ['bypass_cache', 'wait_until', 'timeout_ms'] },
  back: { effect: M, params: ['wait_until', 'timeout_ms'] },
  forward: { effect: M, params: ['wait_until', 'timeout_ms'] },
  click: { effect: M, params: ['selector', 'frame', 'button', 'click_count', 'wait_until', 'timeout_ms'] },
  type: { effect: M, params: ['selector', 'frame', 'text', 'clear', 'submit', 'wait_until', 'timeout_ms'] },
  press: { effect: M, params: ['keys', 'selector', 'frame'] },
  hover: { effect: M, params: ['selector', 'frame'] },
  scroll: { effect: M, params: ['selector', 'frame', 'x', 'y'] },
  select: { effect: M, params: ['selector', 'frame', 'values', 'labels'] },
  check: { effect: M, params: ['selector', 'frame'] },
  uncheck: { effect: M, params: ['selector', 'frame'] },
  upload: { effect: M, params: ['selector', 'frame', 'files'] },
  wait_for: { effect: O, params: ['selector', 'frame', 'state', 'timeout_ms'] },
  extract: { effect: O, params: ['selector', 'frame', 'format', 'all', 'attribute', 'max_bytes'] },
  parse: { effect: O, params: ['fields', 'frame'] },
  evaluate: { effect: M, params: ['expression', 'args'] },
  screenshot: { effect: O, params: ['format', 'quality', 'full_page', 'selector', 'frame'] },
  pdf: { effect: O, params: ['landscape', 'print_background'] },
  cookies: { effect: O, params: ['urls'] },
  set_cookies: { effect: M, params: ['cookies'] },
  clear_cookies: { effect: M, params: ['urls'] },
  storage: { effect: O, params: ['kind'] },
  set_storage: { effect: M, params: ['kind', 'items'] },
  clear_storage: { effect: M, params: ['kind', 'items'] },
  close: { effect: M, params: [] },
};

export const COMMAND_NAMES = Object.freeze(Object.keys(CATALOGUE));

/** EFFECTS is hello.effects: each command's effect. */
export const EFFECTS = Object.freeze(Object.fromEntries(COMMAND_NAMES.map((n) => [n, CATALOGUE[n].effect])));

function invalid(message) {
  return new CommandError(CODES.INVALID_PARAMS, message);
}

function optBool(p, key, dflt) {
  if (p[key] === undefined || p[key] === null) return dflt;
  if (typeof p[key] !== 'boolean') throw invalid(`${key} must be true or false`);
  return p[key];
}

function optInt(p, key, min, max) {
  const v = p[key];
  if (v === undefined || v === null) return undefined;
  if (!Number.isInteger(v) || v < min || v > max) throw invalid(`${key} must be a whole number from ${min} to ${max}`);
  return v;
}

function optEnum(p, key, allowed, dflt) {
  const v = p[key];
  if (v === undefined || v === null) return dflt;
  if (!allowed.includes(v)) throw invalid(`${key} must be one of ${allowed.map((a) => `"${a}"`).join(', ')}`);
  return v;
}

function cssSelector(v, key, required) {
  if (v === undefined || v === null) {
    if (required) throw invalid(`${key} is required`);
    return undefined;
  }
  if (typeof v !== 'string' || v.trim() === '') throw invalid(`${key} must be a non-empty CSS selector`);
  if (v.length > MAX_SELECTOR_CHARS) throw invalid(`${key} is longer than ${MAX_SELECTOR_CHARS} characters`);
  return v;
}

/** element reads an element command's selector and optional frame. */
function element(p, required = true) {
  return { selector: cssSelector(p.selector, 'selector', required), frame: cssSelector(p.frame, 'frame', false) };
}

function waits(p) {
  return { wait_until: optEnum(p, 'wait_until', WAIT_UNTIL, undefined), timeout_ms: optInt(p, 'timeout_ms', 1, MAX_TIMEOUT_MS) };
}

function stringList(p, key, max) {
  const v = p[key];
  if (!Array.isArray(v) || v.some((x) => typeof x !== 'string')) throw invalid(`${key} must be an array of strings`);
  if (v.length > max) throw invalid(`${key} has more than ${max} entries`);
  return v;
}

/**
 * checkURL accepts the URLs a worker tab may be sent to: http, https and
 * about:blank. Other schemes (javascript:, file:, chrome:, data:) are
 * refused: they either run code or reach what the person did not put on the
 * web.
 */
export function checkURL(raw, key = 'url') {
  if (typeof raw !== 'string' || raw === '') throw invalid(`${key} is required and must be a string`);
  if (raw.length > MAX_URL_CHARS) throw invalid(`${key} is longer than ${MAX_URL_CHARS} characters`);
  if (raw === 'about:blank') return raw;
  let u;
  try {
    u = new URL(raw);
  } catch {
    throw invalid(`${key} "${raw.slice(0, 200)}" is not an absolute URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw invalid(`${key} must be http, https or about:blank, not ${u.protocol}`);
  }
  return u.toString();
}

function urls(p) {
  if (p.urls === undefined || p.urls === null) return undefined;
  return stringList(p, 'urls', MAX_VALUES).map((u) => checkURL(u, 'urls[]'));
}

/** parseKeys reads "Control+Shift+A" into its modifiers and its key. */
export function parseKeys(keys) {
  if (typeof keys !== 'string' || keys === '') throw invalid('keys is required, such as "Enter" or "Control+A"');
  if (keys.length > MAX_KEYS_CHARS) throw invalid(`keys is longer than ${MAX_KEYS_CHARS} characters`);
  // "+" alone, or a chord ending in "+" ("Shift++"), presses the plus key.
  const parts = keys === '+' ? ['+'] : keys.endsWith('++') ? [...keys.slice(0, -2).split('+'), '+'] : keys.split('+');
  const key = parts.pop();
  const modifiers = [];
  for (const m of parts) {
    const name = MODIFIER_ALIASES[m];
    if (!name) throw invalid(`"${m}" in keys is not a modifier (Control, Shift, Alt, Meta)`);
    if (!modifiers.includes(name)) modifiers.push(name);
  }
  if (!KEYS[key] && [...key].length !== 1) throw invalid(`"${key}" is not a key this extension knows: one character, or ${Object.keys(KEYS).join(', ')}`);
  return { key, modifiers };
}

const MODIFIER_ALIASES = {
  Control: 'Control', Ctrl: 'Control', Shift: 'Shift', Alt: 'Alt', Meta: 'Meta', Command: 'Meta', ControlOrMeta: 'Control',
};

// Named keys: their DOM code and Windows virtual key code (what Chrome's
// input pipeline needs), and the text a key press inserts.
export const KEYS = Object.freeze({
  Enter: { code: 'Enter', keyCode: 13, text: '\r' },
  Tab: { code: 'Tab', keyCode: 9 },
  Escape: { code: 'Escape', keyCode: 27 },
  Backspace: { code: 'Backspace', keyCode: 8 },
  Delete: { code: 'Delete', keyCode: 46 },
  Space: { code: 'Space', keyCode: 32, text: ' ', key: ' ' },
  ArrowUp: { code: 'ArrowUp', keyCode: 38 },
  ArrowDown: { code: 'ArrowDown', keyCode: 40 },
  ArrowLeft: { code: 'ArrowLeft', keyCode: 37 },
  ArrowRight: { code: 'ArrowRight', keyCode: 39 },
  Home: { code: 'Home', keyCode: 36 },
  End: { code: 'End', keyCode: 35 },
  PageUp: { code: 'PageUp', keyCode: 33 },
  PageDown: { code: 'PageDown', keyCode: 34 },
  Insert: { code: 'Insert', keyCode: 45 },
  F1: { code: 'F1', keyCode: 112 }, F2: { code: 'F2', keyCode: 113 }, F3: { code: 'F3', keyCode: 114 },
  F4: { code: 'F4', keyCode: 115 }, F5: { code: 'F5', keyCode: 116 }, F6: { code: 'F6', keyCode: 117 },
  F7: { code: 'F7', keyCode: 118 }, F8: { code: 'F8', keyCode: 119 }, F9: { code: 'F9', keyCode: 120 },
  F10: { code: 'F10', keyCode: 121 }, F11: { code: 'F11', keyCode: 122 }, F12: { code: 'F12', keyCode: 123 },
});

/** keyEvent describes one key for CDP's Input.dispatchKeyEvent. */
export function keyEvent(key) {
  const k = KEYS[key];
  if (k) return { key: k.key ?? key, code: k.code, keyCode: k.keyCode, text: k.text };
  const upper = key.toUpperCase();
  if (/^[a-z]$/i.test(key)) return { key, code: `Key${upper}`, keyCode: upper.charCodeAt(0), text: key };
  if (/^[0-9]$/.test(key)) return { key, code: `Digit${key}`, keyCode: key.charCodeAt(0), text: key };
  return { key, code: '', keyCode: 0, text: key };
}

function parseFields(v, depth, path) {
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw invalid(`${path} must be an object of field definitions`);
  const names = Object.keys(v);
  if (names.length === 0) throw invalid(`${path} names no field`);
  if (names.length > MAX_PARSE_FIELDS) throw invalid(`${path} has more than ${MAX_PARSE_FIELDS} fields`);
  if (depth > MAX_PARSE_DEPTH) throw invalid(`${path} nests deeper than ${MAX_PARSE_DEPTH} levels`);
  const out = {};
  for (const name of names) {
    const f = v[name];
    const at = `${path}.${name}`;
    if (!f || typeof f !== 'object' || Array.isArray(f)) throw invalid(`${at} must be an object with a selector`);
    for (const k of Object.keys(f)) {
      if (!['selector', 'attribute', 'all', 'fields'].includes(k)) throw invalid(`${at} takes no "${k.slice(0, 64)}"; it takes selector, attribute, all, fields`);
    }
    const def = { selector: cssSelector(f.selector, `${at}.selector`, f.fields === undefined), all: optBool(f, 'all', false) };
    if (f.attribute !== undefined && f.attribute !== null) {
      if (typeof f.attribute !== 'string' || f.attribute === '') throw invalid(`${at}.attribute must be a non-empty string`);
      def.attribute = f.attribute;
    }
    if (f.fields !== undefined && f.fields !== null) {
      if (def.attribute) throw invalid(`${at} takes attribute or fields, not both`);
      def.fields = parseFields(f.fields, depth + 1, `${at}.fields`);
    }
    out[name] = def;
  }
  return out;
}

function files(p) {
  if (!Array.isArray(p.files) || p.files.length === 0) throw invalid('files must be a non-empty array of {name, mime, data}');
  if (p.files.length > MAX_FILES) throw invalid(`files has more than ${MAX_FILES} entries`);
  return p.files.map((f, i) => {
    if (!f || typeof f !== 'object' || Array.isArray(f)) throw invalid(`files[${i}] must be an object`);
    for (const k of Object.keys(f)) if (!['name', 'mime', 'data'].includes(k)) throw invalid(`files[${i}] takes no "${k.slice(0, 64)}"`);
    if (typeof f.name !== 'string' || f.name === '' || /[/\\]/.test(f.name)) throw invalid(`files[${i}].name must be a file name`);
    if (f.mime !== undefined && typeof f.mime !== 'string') throw invalid(`files[${i}].mime must be a string`);
    if (typeof f.data !== 'string' || !/^[A-Za-z0-9+/]*={0,2}$/.test(f.data) || f.data.length % 4 !== 0) {
      throw invalid(`files[${i}].data must be standard base64`);
    }
    return { name: f.name, mime: f.mime || 'application/octet-stream', data: f.data };
  });
}

function cookie(c, i) {
  const at = `cookies[${i}]`;
  if (!c || typeof c !== 'object' || Array.isArray(c)) throw invalid(`${at} must be an object`);
  const known = ['name', 'value', 'url', 'domain', 'path', 'expires', 'http_only', 'secure', 'same_site'];
  for (const k of Object.keys(c)) if (!known.includes(k)) throw invalid(`${at} takes no "${k.slice(0, 64)}"; it takes ${known.join(', ')}`);
  if (typeof c.name !== 'string' || c.name === '') throw invalid(`${at}.name must be a non-empty string`);
  if (typeof c.value !== 'string') throw invalid(`${at}.value must be a string`);
  for (const k of ['domain', 'path']) if (c[k] !== undefined && c[k] !== null && typeof c[k] !== 'string') throw invalid(`${at}.${k} must be a string`);
  if (c.expires !== undefined && c.expires !== null && (typeof c.expires !== 'number' || !Number.isFinite(c.expires))) {
    throw invalid(`${at}.expires must be seconds since the epoch`);
  }
  const out = { name: c.name, value: c.value };
  if (c.url !== undefined && c.url !== null) out.url = checkURL(c.url, `${at}.url`);
  if (c.domain) out.domain = c.domain;
  if (c.path) out.path = c.path;
  if (typeof c.expires === 'number' && c.expires > 0) out.expires = c.expires;
  out.http_only = optBool(c, 'http_only', undefined);
  out.secure = optBool(c, 'secure', undefined);
  out.same_site = optEnum(c, 'same_site', SAME_SITE, undefined);
  return out;
}

function storageItems(p, name) {
  const v = p.items;
  if (name === 'clear_storage') {
    if (v === undefined || v === null) return undefined;
    return stringList(p, 'items', MAX_VALUES);
  }
  if (!v || typeof v !== 'object' || Array.isArray(v)) throw invalid('items must be an object of strings');
  for (const [k, x] of Object.entries(v)) if (typeof x !== 'string') throw invalid(`items.${k.slice(0, 64)} must be a string`);
  return v;
}

/**
 * checkParams validates the params of command name and returns them with
 * defaults filled in. It throws a CommandError: unsupported_command for a
 * name it does not know, invalid_params for bad params.
 */
export function checkParams(name, params) {
  if (typeof name !== 'string' || !Object.hasOwn(CATALOGUE, name)) {
    throw new CommandError(CODES.UNSUPPORTED_COMMAND,
      `the browser extension has no command "${String(name).slice(0, 128)}"; it knows ${COMMAND_NAMES.join(', ')}`);
  }
  if (params === undefined || params === null) params = {};
  if (typeof params !== 'object' || Array.isArray(params)) throw invalid('params must be a JSON object');
  const allowed = CATALOGUE[name].params;
  for (const k of Object.keys(params)) {
    if (!allowed.includes(k)) {
      throw invalid(`${name} takes no param "${k.slice(0, 64)}"` + (allowed.length ? `; it takes ${allowed.join(', ')}` : ''));
    }
  }
  const p = params;
  switch (name) {
    case 'navigate':
      return { url: checkURL(p.url), ...waits(p), wait_until: optEnum(p, 'wait_until', WAIT_UNTIL, 'load') };
    case 'reload':
      return { bypass_cache: optBool(p, 'bypass_cache', false), ...waits(p), wait_until: optEnum(p, 'wait_until', WAIT_UNTIL, 'load') };
    case 'back':
    case 'forward':
      return { ...waits(p), wait_until: optEnum(p, 'wait_until', WAIT_UNTIL, 'load') };
    case 'click':
      return {
        ...element(p), button: optEnum(p, 'button', ['left', 'middle', 'right'], 'left'),
        click_count: optInt(p, 'click_count', 1, 3) ?? 1, ...waits(p),
      };
    case 'type': {
      if (typeof p.text !== 'string') throw invalid('text is required and must be a string');
      if (p.text.length > MAX_TYPE_CHARS) throw invalid(`text is longer than ${MAX_TYPE_CHARS} characters`);
      return { ...element(p), text: p.text, clear: optBool(p, 'clear', true), submit: optBool(p, 'submit', false), ...waits(p) };
    }
    case 'press':
      return { ...parseKeys(p.keys), keys: p.keys, ...element(p, false) };
    case 'hover':
    case 'check':
    case 'uncheck':
      return element(p);
    case 'scroll': {
      const x = p.x ?? undefined;
      const y = p.y ?? undefined;
      for (const [k, v] of [['x', x], ['y', y]]) {
        if (v !== undefined && (typeof v !== 'number' || !Number.isFinite(v) || Math.abs(v) > MAX_SCROLL_PX)) {
          throw invalid(`${k} must be a number of pixels`);
        }
      }
      const el = element(p, false);
      if (el.selector === undefined && x === undefined && y === undefined) throw invalid('scroll needs a selector, or x and/or y');
      if (el.selector !== undefined && (x !== undefined || y !== undefined)) throw invalid('scroll takes a selector or x/y, not both');
      return { ...el, x: x ?? 0, y: y ?? 0 };
    }
    case 'select': {
      const has = (k) => p[k] !== undefined && p[k] !== null;
      if (has('values') === has('labels')) throw invalid('select takes values or labels (one of them)');
      const key = has('values') ? 'values' : 'labels';
      return { ...element(p), by: key, options: stringList(p, key, MAX_VALUES) };
    }
    case 'upload':
      return { ...element(p), files: files(p) };
    case 'wait_for':
      return { ...element(p), state: optEnum(p, 'state', WAIT_STATES, 'attached'), timeout_ms: optInt(p, 'timeout_ms', 1, MAX_TIMEOUT_MS) };
    case 'extract': {
      const format = optEnum(p, 'format', ['text', 'html'], 'text');
      const attribute = p.attribute ?? undefined;
      if (attribute !== undefined && (typeof attribute !== 'string' || attribute === '')) throw invalid('attribute must be a non-empty string');
      const all = optBool(p, 'all', false);
      const el = element(p, false);
      if ((all || attribute) && !el.selector) throw invalid('all and attribute need a selector');
      return { ...el, format, all, attribute, max_bytes: optInt(p, 'max_bytes', 1, Number.MAX_SAFE_INTEGER) ?? DEFAULT_EXTRACT_BYTES };
    }
    case 'parse':
      return { fields: parseFields(p.fields, 1, 'fields'), frame: cssSelector(p.frame, 'frame', false) };
    case 'evaluate': {
      if (typeof p.expression !== 'string' || p.expression.trim() === '') throw invalid('expression is required: a function\'s source, such as "(a, b) => a + b"');
      if (p.expression.length > MAX_EXPRESSION_CHARS) throw invalid(`expression is longer than ${MAX_EXPRESSION_CHARS} characters`);
      if (p.args !== undefined && p.args !== null && !Array.isArray(p.args)) throw invalid('args must be an array of JSON values');
      return { expression: p.expression, args: p.args ?? [] };
    }
    case 'screenshot': {
      const format = optEnum(p, 'format', ['png', 'jpeg'], 'png');
      const quality = optInt(p, 'quality', 0, 100);
      if (quality !== undefined && format !== 'jpeg') throw invalid('quality applies to format "jpeg" only');
      const full = optBool(p, 'full_page', false);
      const el = element(p, false);
      if (full && el.selector) throw invalid('screenshot takes full_page or selector, not both');
      if (el.frame && !el.selector) throw invalid('frame needs a selector');
      return { format, quality, full_page: full, ...el };
    }
    case 'pdf':
      return { landscape: optBool(p, 'landscape', false), print_background: optBool(p, 'print_background', false) };
    case 'cookies':
    case 'clear_cookies':
      return { urls: urls(p) };
    case 'set_cookies': {
      if (!Array.isArray(p.cookies) || p.cookies.length === 0) throw invalid('cookies must be a non-empty array');
      if (p.cookies.length > MAX_COOKIES) throw invalid(`cookies has more than ${MAX_COOKIES} entries`);
      return { cookies: p.cookies.map(cookie) };
    }
    case 'storage':
      return { kind: optEnum(p, 'kind', ['local', 'session'], 'local') };
    case 'set_storage':
    case 'clear_storage':
      return { kind: optEnum(p, 'kind', ['local', 'session'], 'local'), items: storageItems(p, name) };
    case 'close':
      return {};
  }
  throw new Error('unreachable');
}

/**
 * checkOptions reads the options the extension acts on (DESIGN §7):
 * capture, events, dialogs and prompt_text. Other members belong to others
 * (the broker passes the caller's object through) and are left alone; the
 * ones named here must be well formed.
 */
export function checkOptions(o) {
  const out = { capture: { screenshot: false, html: false, text: false }, events: new Set(), dialogs: undefined, prompt_text: undefined };
  if (o === undefined || o === null) return out;
  if (typeof o !== 'object' || Array.isArray(o)) throw invalid('options must be a JSON object');
  if (o.capture !== undefined && o.capture !== null) {
    if (typeof o.capture !== 'object' || Array.isArray(o.capture)) throw invalid('options.capture must be an object such as {"screenshot": true}');
    for (const k of Object.keys(o.capture)) {
      if (!(k in out.capture)) throw invalid(`options.capture takes screenshot, html and text, not "${k.slice(0, 64)}"`);
      out.capture[k] = optBool(o.capture, k, false);
    }
  }
  if (o.events !== undefined && o.events !== null) {
    if (!Array.isArray(o.events)) throw invalid('options.events must be an array of event kinds');
    for (const k of o.events) {
      if (!EVENT_KINDS.includes(k)) throw invalid(`options.events: "${String(k).slice(0, 64)}" is not one of ${EVENT_KINDS.join(', ')}`);
      out.events.add(k);
    }
  }
  out.dialogs = optEnum(o, 'dialogs', ['accept', 'dismiss'], undefined);
  if (o.prompt_text !== undefined && o.prompt_text !== null) {
    if (typeof o.prompt_text !== 'string') throw invalid('options.prompt_text must be a string');
    out.prompt_text = o.prompt_text;
  }
  return out;
}

/**
 * deadlineFor says when the extension gives up on a command: its own
 * timeout_ms param when given, bounded by the broker's timeout_ms less a
 * margin, so that the extension's "timeout" error reaches the broker before
 * the broker marks the command timed_out.
 */
export function deadlineFor(now, commandTimeoutMs, paramTimeoutMs) {
  const broker = commandTimeoutMs > 0 ? commandTimeoutMs : 30000;
  const margin = Math.min(1000, Math.floor(broker / 10));
  let ms = broker - margin;
  if (paramTimeoutMs !== undefined && paramTimeoutMs < ms) ms = paramTimeoutMs;
  return now + ms;
}
