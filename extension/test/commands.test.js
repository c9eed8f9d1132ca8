import assert from 'node:assert/strict';
import { test } from 'node:test';

import { COMMAND_NAMES, DEFAULT_EXTRACT_BYTES, checkParams, checkURL, deadlineFor } from '../src/lib/commands.js';

const code = (fn) => {
  try {
    fn();
  } catch (e) {
    return e.code;
  }
  return null;
};

test('every command has a params checker', () => {
  const minimal = {
    navigate: { url: 'https://e.x/' }, reload: {}, extract: {}, click: { selector: 'a' },
    type: { selector: 'a', text: '' }, wait_for: { selector: 'a' }, screenshot: {}, close: {},
  };
  for (const name of COMMAND_NAMES) assert.ok(checkParams(name, minimal[name]), name);
});

test('unknown commands are unsupported_command', () => {
  assert.equal(code(() => checkParams('fly', {})), 'unsupported_command');
  assert.equal(code(() => checkParams('__proto__', {})), 'unsupported_command');
  assert.equal(code(() => checkParams('toString', {})), 'unsupported_command');
});

test('params must be an object with known keys', () => {
  assert.equal(code(() => checkParams('extract', [1])), 'invalid_params');
  assert.equal(code(() => checkParams('extract', 'x')), 'invalid_params');
  assert.equal(code(() => checkParams('extract', { selektor: '#a' })), 'invalid_params');
  assert.equal(code(() => checkParams('close', { now: true })), 'invalid_params');
  assert.deepEqual(checkParams('close', null), {});
  assert.deepEqual(checkParams('reload', undefined), { bypass_cache: false, timeout_ms: undefined });
});

test('navigate takes http, https and about:blank only', () => {
  assert.equal(checkParams('navigate', { url: 'http://127.0.0.1:8080/a b' }).url, 'http://127.0.0.1:8080/a%20b');
  assert.equal(checkURL('about:blank'), 'about:blank');
  for (const url of ['javascript:alert(1)', 'file:///etc/passwd', 'chrome://settings', 'data:text/html,x', 'relative/path', '', 42, null]) {
    assert.equal(code(() => checkParams('navigate', { url })), 'invalid_params', String(url));
  }
  assert.equal(code(() => checkParams('navigate', { url: 'https://e.x/', timeout_ms: 0 })), 'invalid_params');
  assert.equal(code(() => checkParams('navigate', { url: 'https://e.x/', timeout_ms: 1.5 })), 'invalid_params');
  assert.equal(checkParams('navigate', { url: 'https://e.x/', timeout_ms: 5000 }).timeout_ms, 5000);
});

test('extract defaults and bounds', () => {
  assert.deepEqual(checkParams('extract', {}), { format: 'text', selector: undefined, max_bytes: DEFAULT_EXTRACT_BYTES });
  assert.equal(checkParams('extract', { format: 'html', selector: 'main', max_bytes: 10 }).max_bytes, 10);
  assert.equal(code(() => checkParams('extract', { format: 'pdf' })), 'invalid_params');
  assert.equal(code(() => checkParams('extract', { max_bytes: 0 })), 'invalid_params');
  assert.equal(code(() => checkParams('extract', { selector: '  ' })), 'invalid_params');
  assert.equal(code(() => checkParams('extract', { selector: 'a'.repeat(5000) })), 'invalid_params');
});

test('click, type and wait_for need a selector; type needs text', () => {
  for (const name of ['click', 'type', 'wait_for']) {
    assert.equal(code(() => checkParams(name, { text: 'x' })), 'invalid_params', name);
  }
  assert.equal(code(() => checkParams('type', { selector: '#a' })), 'invalid_params');
  assert.equal(code(() => checkParams('type', { selector: '#a', text: 5 })), 'invalid_params');
  assert.equal(code(() => checkParams('type', { selector: '#a', text: 'x', clear: 'yes' })), 'invalid_params');
  assert.deepEqual(checkParams('type', { selector: '#a', text: 'x' }), { selector: '#a', text: 'x', clear: true, submit: false });
  assert.deepEqual(checkParams('wait_for', { selector: '#a', visible: true, timeout_ms: 10 }), { selector: '#a', visible: true, timeout_ms: 10 });
  assert.equal(code(() => checkParams('screenshot', { format: 'jpeg' })), 'invalid_params');
});

test('the deadline leaves the broker a margin and honours a shorter param', () => {
  assert.equal(deadlineFor(0, 20000, undefined), 19000);
  assert.equal(deadlineFor(0, 2000, undefined), 1800);
  assert.equal(deadlineFor(0, 20000, 1500), 1500);
  assert.equal(deadlineFor(0, 0, undefined), 29000); // no timeout_ms: the broker's default, 30 s
  assert.equal(deadlineFor(100, 20000, 60000), 19100);
});
