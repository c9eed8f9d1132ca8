import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  COMMAND_NAMES, DEFAULT_EXTRACT_BYTES, EFFECTS, checkOptions, checkParams, checkURL, deadlineFor, keyEvent, parseKeys,
} from '../src/lib/commands.js';

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
    navigate: { url: 'https://e.x/' }, reload: {}, back: {}, forward: {}, extract: {}, click: { selector: 'a' },
    type: { selector: 'a', text: '' }, press: { keys: 'Enter' }, hover: { selector: 'a' }, scroll: { y: 100 },
    select: { selector: 's', values: ['1'] }, check: { selector: 'a' }, uncheck: { selector: 'a' },
    upload: { selector: 'f', files: [{ name: 'a.txt', data: 'YQ==' }] }, wait_for: { selector: 'a' },
    parse: { fields: { t: { selector: 'h1' } } }, evaluate: { expression: '() => 1' }, screenshot: {}, pdf: {},
    cookies: {}, set_cookies: { cookies: [{ name: 'a', value: 'b' }] }, clear_cookies: {}, storage: {},
    set_storage: { items: { a: 'b' } }, clear_storage: {}, close: {},
  };
  assert.deepEqual(Object.keys(minimal).sort(), [...COMMAND_NAMES].sort());
  for (const name of COMMAND_NAMES) assert.ok(checkParams(name, minimal[name]), name);
  // Every command, with a param it does not take, is invalid_params.
  for (const name of COMMAND_NAMES) assert.equal(code(() => checkParams(name, { ...minimal[name], selecter: 'a' })), 'invalid_params', name);
});

test('effects follow the catalogue', () => {
  assert.deepEqual(Object.keys(EFFECTS).sort(), [...COMMAND_NAMES].sort());
  for (const n of ['wait_for', 'extract', 'parse', 'screenshot', 'pdf', 'cookies', 'storage']) assert.equal(EFFECTS[n], 'observe', n);
  for (const n of ['navigate', 'click', 'type', 'evaluate', 'set_cookies', 'clear_storage', 'close', 'upload']) assert.equal(EFFECTS[n], 'mutate', n);
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
  assert.deepEqual(checkParams('reload', undefined), { bypass_cache: false, timeout_ms: undefined, wait_until: 'load' });
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
  assert.deepEqual(checkParams('extract', {}), {
    format: 'text', selector: undefined, frame: undefined, all: false, attribute: undefined, max_bytes: DEFAULT_EXTRACT_BYTES,
  });
  assert.equal(code(() => checkParams('extract', { all: true })), 'invalid_params'); // all needs a selector
  assert.equal(code(() => checkParams('extract', { selector: 'a', attribute: '' })), 'invalid_params');
  assert.equal(checkParams('extract', { selector: 'a', attribute: 'href', all: true }).attribute, 'href');
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
  assert.deepEqual(checkParams('type', { selector: '#a', text: 'x' }), {
    selector: '#a', frame: undefined, text: 'x', clear: true, submit: false, wait_until: undefined, timeout_ms: undefined,
  });
  assert.deepEqual(checkParams('wait_for', { selector: '#a', state: 'visible', timeout_ms: 10 }), { selector: '#a', frame: undefined, state: 'visible', timeout_ms: 10 });
  assert.equal(code(() => checkParams('wait_for', { selector: '#a', visible: true })), 'invalid_params');
  assert.equal(code(() => checkParams('wait_for', { selector: '#a', state: 'gone' })), 'invalid_params');
  assert.equal(code(() => checkParams('click', { selector: '#a', wait_until: 'idle' })), 'invalid_params');
  assert.equal(code(() => checkParams('click', { selector: '#a', button: 'back' })), 'invalid_params');
  assert.equal(code(() => checkParams('click', { selector: '#a', click_count: 4 })), 'invalid_params');
  assert.equal(code(() => checkParams('click', { selector: '#a', frame: '' })), 'invalid_params');
  assert.equal(checkParams('click', { selector: '#a', frame: 'iframe#f' }).frame, 'iframe#f');
});

test('navigation params', () => {
  assert.equal(checkParams('navigate', { url: 'https://e.x/' }).wait_until, 'load');
  for (const w of ['load', 'domcontentloaded', 'networkidle']) assert.equal(checkParams('back', { wait_until: w }).wait_until, w);
  assert.equal(code(() => checkParams('navigate', { url: 'https://e.x/', wait_until: 'commit' })), 'invalid_params');
  assert.equal(code(() => checkParams('forward', { url: 'https://e.x/' })), 'invalid_params');
});

test('screenshot and pdf params', () => {
  assert.deepEqual(checkParams('screenshot', {}), { format: 'png', quality: undefined, full_page: false, selector: undefined, frame: undefined });
  assert.equal(checkParams('screenshot', { format: 'jpeg', quality: 80 }).quality, 80);
  assert.equal(code(() => checkParams('screenshot', { format: 'png', quality: 80 })), 'invalid_params');
  assert.equal(code(() => checkParams('screenshot', { format: 'gif' })), 'invalid_params');
  assert.equal(code(() => checkParams('screenshot', { format: 'jpeg', quality: 101 })), 'invalid_params');
  assert.equal(code(() => checkParams('screenshot', { full_page: true, selector: 'a' })), 'invalid_params');
  assert.deepEqual(checkParams('pdf', { landscape: true }), { landscape: true, print_background: false });
  assert.equal(code(() => checkParams('pdf', { landscape: 'yes' })), 'invalid_params');
});

test('interaction params', () => {
  assert.deepEqual(parseKeys('Enter'), { key: 'Enter', modifiers: [] });
  assert.deepEqual(parseKeys('Control+Shift+A'), { key: 'A', modifiers: ['Control', 'Shift'] });
  assert.deepEqual(parseKeys('Ctrl++'), { key: '+', modifiers: ['Control'] });
  for (const k of ['', 'Hyper+A', 'Control+', 'NoSuchKey', 42]) assert.equal(code(() => checkParams('press', { keys: k })), 'invalid_params', String(k));
  assert.deepEqual(keyEvent('Enter'), { key: 'Enter', code: 'Enter', keyCode: 13, text: '\r' });
  assert.deepEqual(keyEvent('a'), { key: 'a', code: 'KeyA', keyCode: 65, text: 'a' });
  assert.equal(code(() => checkParams('scroll', {})), 'invalid_params');
  assert.equal(code(() => checkParams('scroll', { selector: 'a', y: 1 })), 'invalid_params');
  assert.equal(code(() => checkParams('scroll', { y: 'down' })), 'invalid_params');
  assert.deepEqual(checkParams('scroll', { y: 300 }), { selector: undefined, frame: undefined, x: 0, y: 300 });
  assert.equal(code(() => checkParams('select', { selector: 's' })), 'invalid_params');
  assert.equal(code(() => checkParams('select', { selector: 's', values: ['a'], labels: ['b'] })), 'invalid_params');
  assert.equal(code(() => checkParams('select', { selector: 's', values: [1] })), 'invalid_params');
  assert.deepEqual(checkParams('select', { selector: 's', labels: ['B'] }).by, 'labels');
  for (const files of [[], 'x', [{ name: 'a' }], [{ name: '../a', data: 'YQ==' }], [{ name: 'a', data: 'not base64!' }], [{ name: 'a', data: 'YQ==', size: 1 }]]) {
    assert.equal(code(() => checkParams('upload', { selector: 'f', files })), 'invalid_params', JSON.stringify(files));
  }
  assert.equal(checkParams('upload', { selector: 'f', files: [{ name: 'a.txt', data: 'YQ==' }] }).files[0].mime, 'application/octet-stream');
});

test('reading and state params', () => {
  const fields = { title: { selector: 'h1' }, items: { selector: 'li', all: true, fields: { name: { selector: '.n' }, link: { selector: 'a', attribute: 'href' } } } };
  assert.equal(checkParams('parse', { fields }).fields.items.fields.link.attribute, 'href');
  for (const f of [undefined, {}, { t: 'h1' }, { t: { selector: 'h1', css: 1 } }, { t: { attribute: 'x' } }, { t: { selector: 'a', attribute: 'x', fields: { u: { selector: 'b' } } } }]) {
    assert.equal(code(() => checkParams('parse', { fields: f })), 'invalid_params', JSON.stringify(f));
  }
  let deep = { x: { selector: 'a' } };
  for (let i = 0; i < 9; i++) deep = { x: { selector: 'a', fields: deep } };
  assert.equal(code(() => checkParams('parse', { fields: deep })), 'invalid_params');
  assert.equal(code(() => checkParams('evaluate', { expression: '' })), 'invalid_params');
  assert.equal(code(() => checkParams('evaluate', { expression: '() => 1', args: {} })), 'invalid_params');
  assert.equal(code(() => checkParams('cookies', { urls: ['file:///x'] })), 'invalid_params');
  assert.equal(code(() => checkParams('set_cookies', { cookies: [{ name: 'a' }] })), 'invalid_params');
  assert.equal(code(() => checkParams('set_cookies', { cookies: [{ name: 'a', value: 'b', same_site: 'none' }] })), 'invalid_params');
  assert.equal(code(() => checkParams('set_cookies', { cookies: [{ name: 'a', value: 'b', sameSite: 'lax' }] })), 'invalid_params');
  assert.equal(code(() => checkParams('storage', { kind: 'indexeddb' })), 'invalid_params');
  assert.equal(code(() => checkParams('set_storage', { items: { a: 1 } })), 'invalid_params');
  assert.deepEqual(checkParams('clear_storage', { kind: 'session', items: ['a'] }), { kind: 'session', items: ['a'] });
});

test('options the extension acts on are checked; others are left alone', () => {
  const o = checkOptions({ capture: { screenshot: true }, events: ['console', 'download'], dialogs: 'accept', prompt_text: 'yes', parser: {} });
  assert.deepEqual(o.capture, { screenshot: true, html: false, text: false });
  assert.deepEqual([...o.events], ['console', 'download']);
  assert.equal(o.dialogs, 'accept');
  for (const bad of [[], { capture: { pdf: true } }, { capture: 'all' }, { events: 'console' }, { events: ['keys'] }, { dialogs: 'ignore' }, { prompt_text: 1 }]) {
    assert.equal(code(() => checkOptions(bad)), 'invalid_params', JSON.stringify(bad));
  }
});

test('the deadline leaves the broker a margin and honours a shorter param', () => {
  assert.equal(deadlineFor(0, 20000, undefined), 19000);
  assert.equal(deadlineFor(0, 2000, undefined), 1800);
  assert.equal(deadlineFor(0, 20000, 1500), 1500);
  assert.equal(deadlineFor(0, 0, undefined), 29000); // no timeout_ms: the broker's default, 30 s
  assert.equal(deadlineFor(100, 20000, 60000), 19100);
});
