// The commands a worker tab runs, and the checking of their params. Pure:
// no browser APIs.

import { CODES, CommandError } from './protocol.js';

export const COMMAND_NAMES = Object.freeze([
  'navigate', 'reload', 'extract', 'click', 'type', 'wait_for', 'screenshot', 'close',
]);

// extract returns at most this much unless max_bytes says otherwise; the
// broker's max_message_bytes bounds it further.
export const DEFAULT_EXTRACT_BYTES = 1024 * 1024;
export const MAX_SELECTOR_CHARS = 4096;
export const MAX_TYPE_CHARS = 1024 * 1024;
export const MAX_URL_CHARS = 64 * 1024;
export const MAX_TIMEOUT_MS = 3600 * 1000;

// Which params each command takes; anything else is invalid_params, so that
// a typo ("selecter") fails loudly instead of being ignored.
const ALLOWED = {
  navigate: ['url', 'timeout_ms'],
  reload: ['bypass_cache', 'timeout_ms'],
  extract: ['format', 'selector', 'max_bytes'],
  click: ['selector'],
  type: ['selector', 'text', 'clear', 'submit'],
  wait_for: ['selector', 'timeout_ms', 'visible'],
  screenshot: ['format'],
  close: [],
};

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

function selector(p, required) {
  const s = p.selector;
  if (s === undefined || s === null) {
    if (required) throw invalid('selector is required');
    return undefined;
  }
  if (typeof s !== 'string' || s.trim() === '') throw invalid('selector must be a non-empty CSS selector');
  if (s.length > MAX_SELECTOR_CHARS) throw invalid(`selector is longer than ${MAX_SELECTOR_CHARS} characters`);
  return s;
}

/**
 * checkURL accepts the URLs a worker tab may be sent to: http, https and
 * about:blank. Other schemes (javascript:, file:, chrome:, data:) are
 * refused: they either run code or reach what the person did not put on the
 * web.
 */
export function checkURL(raw) {
  if (typeof raw !== 'string' || raw === '') throw invalid('url is required and must be a string');
  if (raw.length > MAX_URL_CHARS) throw invalid(`url is longer than ${MAX_URL_CHARS} characters`);
  if (raw === 'about:blank') return raw;
  let u;
  try {
    u = new URL(raw);
  } catch {
    throw invalid(`url "${raw.slice(0, 200)}" is not an absolute URL`);
  }
  if (u.protocol !== 'http:' && u.protocol !== 'https:') {
    throw invalid(`url must be http, https or about:blank, not ${u.protocol}`);
  }
  return u.toString();
}

/**
 * checkParams validates the params of command name and returns them with
 * defaults filled in. It throws a CommandError: unsupported_command for a
 * name it does not know, invalid_params for bad params.
 */
export function checkParams(name, params) {
  if (!Object.hasOwn(ALLOWED, name)) {
    throw new CommandError(CODES.UNSUPPORTED_COMMAND,
      `the browser extension has no command "${String(name).slice(0, 128)}"; it knows ${COMMAND_NAMES.join(', ')}`);
  }
  if (params === undefined || params === null) params = {};
  if (typeof params !== 'object' || Array.isArray(params)) throw invalid('params must be a JSON object');
  for (const k of Object.keys(params)) {
    if (!ALLOWED[name].includes(k)) {
      throw invalid(`${name} takes no param "${k.slice(0, 64)}"` +
        (ALLOWED[name].length ? `; it takes ${ALLOWED[name].join(', ')}` : ''));
    }
  }
  const p = params;
  switch (name) {
    case 'navigate':
      return { url: checkURL(p.url), timeout_ms: optInt(p, 'timeout_ms', 1, MAX_TIMEOUT_MS) };
    case 'reload':
      return { bypass_cache: optBool(p, 'bypass_cache', false), timeout_ms: optInt(p, 'timeout_ms', 1, MAX_TIMEOUT_MS) };
    case 'extract': {
      const format = p.format ?? 'text';
      if (format !== 'text' && format !== 'html') throw invalid('format must be "text" or "html"');
      return {
        format,
        selector: selector(p, false),
        max_bytes: optInt(p, 'max_bytes', 1, Number.MAX_SAFE_INTEGER) ?? DEFAULT_EXTRACT_BYTES,
      };
    }
    case 'click':
      return { selector: selector(p, true) };
    case 'type': {
      if (typeof p.text !== 'string') throw invalid('text is required and must be a string');
      if (p.text.length > MAX_TYPE_CHARS) throw invalid(`text is longer than ${MAX_TYPE_CHARS} characters`);
      return {
        selector: selector(p, true), text: p.text,
        clear: optBool(p, 'clear', true), submit: optBool(p, 'submit', false),
      };
    }
    case 'wait_for':
      return {
        selector: selector(p, true),
        timeout_ms: optInt(p, 'timeout_ms', 1, MAX_TIMEOUT_MS),
        visible: optBool(p, 'visible', false),
      };
    case 'screenshot': {
      const format = p.format ?? 'png';
      if (format !== 'png') throw invalid('format must be "png"');
      return { format };
    }
    case 'close':
      return {};
  }
  throw new Error('unreachable');
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
