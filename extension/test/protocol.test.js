import assert from 'node:assert/strict';
import { test } from 'node:test';

import {
  CLOSE, CODES, closeReason, contextIdForTab, contextReport, createFailedFrame, encodeFrame, errorFrame, formatLabels,
  cleartextWarning, frameFits, helloFrame, isPermanentClose, newClientId, normalizeBrokerURL, parseFrame, parseLabels,
  tabIdForContext, truncateUtf8, utf8Length, validId,
} from '../src/lib/protocol.js';

test('normalizeBrokerURL accepts what people type', () => {
  assert.equal(normalizeBrokerURL('localhost:8420'), 'ws://localhost:8420/ws/v1/client');
  assert.equal(normalizeBrokerURL(' http://127.0.0.1:8420 '), 'ws://127.0.0.1:8420/ws/v1/client');
  assert.equal(normalizeBrokerURL('https://broker.example/'), 'wss://broker.example/ws/v1/client');
  assert.equal(normalizeBrokerURL('ws://h:1/ws/v1/client'), 'ws://h:1/ws/v1/client');
  assert.equal(normalizeBrokerURL('wss://h/custom/path#x'), 'wss://h/custom/path');
  assert.throws(() => normalizeBrokerURL(''), /empty/);
  assert.throws(() => normalizeBrokerURL('ftp://h'), /http, https, ws or wss/);
  assert.throws(() => normalizeBrokerURL('http://'), /not a URL/);
});

test('normalizeBrokerURL maps https to wss and keeps a proxy prefix, as the agent does', () => {
  assert.equal(normalizeBrokerURL('https://broker.example.com'), 'wss://broker.example.com/ws/v1/client');
  assert.equal(normalizeBrokerURL('HTTPS://Broker.Example.com:8443'), 'wss://broker.example.com:8443/ws/v1/client');
  assert.equal(normalizeBrokerURL('https://proxy.example/cheetah'), 'wss://proxy.example/cheetah/ws/v1/client');
  assert.equal(normalizeBrokerURL('https://proxy.example/cheetah/'), 'wss://proxy.example/cheetah/ws/v1/client');
  assert.equal(normalizeBrokerURL('http://proxy.example/cheetah'), 'ws://proxy.example/cheetah/ws/v1/client');
  assert.equal(normalizeBrokerURL('https://proxy.example/cheetah/ws/v1/client'), 'wss://proxy.example/cheetah/ws/v1/client');
  assert.equal(normalizeBrokerURL('wss://broker.example.com'), 'wss://broker.example.com/ws/v1/client');
  assert.equal(normalizeBrokerURL('wss://broker.example.com:8443/ws/v1/client'), 'wss://broker.example.com:8443/ws/v1/client');
  assert.equal(normalizeBrokerURL('https://[::1]:8420'), 'wss://[::1]:8420/ws/v1/client');
});

test('cleartextWarning: a key sent over ws:// to another machine is flagged', () => {
  for (const safe of [
    'wss://broker.example.com/ws/v1/client', 'ws://127.0.0.1:8420/ws/v1/client', 'ws://127.8.9.10/ws/v1/client',
    'ws://localhost:8420/ws/v1/client', 'ws://[::1]:8420/ws/v1/client', 'wss://10.0.0.5/ws/v1/client',
  ]) {
    assert.equal(cleartextWarning(safe), '', safe);
  }
  for (const typed of ['http://10.0.0.5:8420', 'broker.example.com:8420', 'ws://192.168.1.2/ws/v1/client', 'http://127.0.0.1.nip.io']) {
    assert.match(cleartextWarning(normalizeBrokerURL(typed)), /in clear.*https:\/\//, typed);
  }
  assert.equal(cleartextWarning(normalizeBrokerURL('https://10.0.0.5:8420')), '');
});

test('hello carries the fields of DESIGN §4', () => {
  const h = helloFrame({
    token: 'chk_x', clientId: 'ext-1', name: 'n', version: '0.1.0', labels: { a: 'b' }, maxContexts: 3,
    effects: { navigate: 'mutate', extract: 'observe' },
  });
  assert.deepEqual(h, {
    type: 'hello', protocol: 1, token: 'chk_x', client_id: 'ext-1', client_type: 'browser',
    name: 'n', version: '0.1.0', labels: { a: 'b' }, capacity: { max_contexts: 3 },
    effects: { navigate: 'mutate', extract: 'observe' },
  });
  const bare = helloFrame({ token: 't', clientId: 'ext-2', labels: {} });
  assert.equal('labels' in bare, false);
  assert.equal('capacity' in bare, false);
  assert.equal('effects' in bare, false);
});

test('client and context ids are valid protocol ids', () => {
  const id = newClientId((n) => new Uint8Array(n).fill(0xab));
  assert.equal(id, 'ext-abababababababab');
  assert.ok(validId(id));
  assert.ok(validId(contextIdForTab(1870195421)));
  assert.equal(tabIdForContext('tab-42'), 42);
  assert.equal(tabIdForContext('tab-x'), null);
  assert.equal(tabIdForContext('flow-1'), null);
  assert.equal(validId('-bad'), false);
});

test('a worker tab is reported as a worker, bounded', () => {
  const r = contextReport({ id: 7, url: 'https://e.x/' + 'a'.repeat(5000), title: 'T' }, { region: 'eu' });
  assert.equal(r.context_id, 'tab-7');
  assert.equal(r.tab_id, '7');
  assert.equal(r.owner, 'worker');
  assert.equal(r.url.length, 2048);
  assert.deepEqual(r.labels, { region: 'eu' });
  assert.deepEqual(contextReport({ id: 8, url: '', title: '' }), { context_id: 'tab-8', tab_id: '8', owner: 'worker' });
});

test('parseFrame is tolerant and never throws', () => {
  assert.deepEqual(parseFrame('{"type":"pong"}'), { frame: { type: 'pong' } });
  assert.ok(parseFrame('nope').error);
  assert.ok(parseFrame('[1]').error);
  assert.ok(parseFrame('{"x":1}').error);
  assert.ok(parseFrame('{"type":"command","name":"x"}').error);
  assert.ok(parseFrame('{"type":"assignment","context_id":"tab-1"}').error);
  // Unknown types and fields pass: a newer broker may send them.
  assert.deepEqual(parseFrame('{"type":"future","x":1}').frame, { type: 'future', x: 1 });
});

test('close codes: 4401, 4403 and 4409 are permanent', () => {
  for (const c of [CLOSE.UNAUTHORIZED, CLOSE.FORBIDDEN, CLOSE.REPLACED]) assert.ok(isPermanentClose(c), c);
  for (const c of [1000, 1001, 1006, CLOSE.MALFORMED, CLOSE.TIMEOUT, CLOSE.TOO_LARGE, CLOSE.RATE_LIMITED]) {
    assert.equal(isPermanentClose(c), false, c);
  }
  assert.match(closeReason(4401), /key/);
  assert.match(closeReason(1001), /shutting down/);
  assert.match(closeReason(4999), /4999/);
});

test('UTF-8 lengths and truncation keep whole characters', () => {
  assert.equal(utf8Length('Grüße 🐆'), 1 + 1 + 2 + 2 + 1 + 1 + 4);
  assert.equal(utf8Length('\ud800'), 3); // a lone surrogate travels as U+FFFD
  assert.deepEqual(truncateUtf8('Grüße', 3), { text: 'Gr', bytes: 2, truncated: true });
  assert.deepEqual(truncateUtf8('Grüße', 4), { text: 'Grü', bytes: 4, truncated: true });
  assert.deepEqual(truncateUtf8('a🐆', 4), { text: 'a', bytes: 1, truncated: true });
  assert.deepEqual(truncateUtf8('a🐆', 5), { text: 'a🐆', bytes: 5, truncated: false });
  assert.deepEqual(truncateUtf8('', 0), { text: '', bytes: 0, truncated: false });
});

test('an oversized terminal frame becomes a too_large error; others are dropped', () => {
  const big = { type: 'result', command_id: 'c1', data: { content: 'x'.repeat(500) } };
  assert.equal(frameFits(big, 100), false);
  const out = JSON.parse(encodeFrame(big, 200));
  assert.equal(out.type, 'error');
  assert.equal(out.code, CODES.TOO_LARGE);
  assert.equal(out.command_id, 'c1');
  assert.equal(encodeFrame({ type: 'capture', command_id: 'c1', mime: 'image/png', data: 'x'.repeat(500) }, 200), null);
  assert.equal(encodeFrame({ type: 'state', contexts: [] }, 5), null);
  assert.equal(encodeFrame({ type: 'ping' }, 100), '{"type":"ping"}');
});

test('error frames always have a code', () => {
  assert.deepEqual(errorFrame('c', '', ''), { type: 'error', command_id: 'c', code: 'command_failed' });
  assert.deepEqual(errorFrame('c', 'timeout', 'slow', { a: 1 }), { type: 'error', command_id: 'c', code: 'timeout', message: 'slow', data: { a: 1 } });
});

test('labels parse from key=value text and back', () => {
  assert.deepEqual(parseLabels('region=eu, team = research\nx=1'), { region: 'eu', team: 'research', x: '1' });
  assert.deepEqual(parseLabels(''), {});
  assert.throws(() => parseLabels('oops'), /key=value/);
  assert.throws(() => parseLabels('=v'), /key=value/);
  assert.equal(formatLabels({ a: 'b', c: 'd' }), 'a=b, c=d');
});

test('create_context is parsed; create_failed and a state report naming the request are built', () => {
  assert.deepEqual(parseFrame('{"type":"create_context","request_id":"cr_0123","url":"https://example.com/"}'),
    { frame: { type: 'create_context', request_id: 'cr_0123', url: 'https://example.com/' } });
  assert.deepEqual(parseFrame('{"type":"create_context","request_id":"cr_1"}'), { frame: { type: 'create_context', request_id: 'cr_1' } });
  assert.match(parseFrame('{"type":"create_context"}').error, /request_id/);
  assert.match(parseFrame('{"type":"create_context","request_id":"bad id"}').error, /request_id/);
  assert.match(parseFrame('{"type":"create_context","request_id":"cr_1","url":7}').error, /url/);
  assert.deepEqual(createFailedFrame('cr_1', 'pool_full', 'full'), { type: 'create_failed', request_id: 'cr_1', code: 'pool_full', message: 'full' });
  assert.deepEqual(createFailedFrame('cr_1', 'pool_full'), { type: 'create_failed', request_id: 'cr_1', code: 'pool_full' });
  assert.deepEqual(contextReport({ id: 4, url: 'about:blank' }, undefined, 'cr_1'),
    { context_id: 'tab-4', tab_id: '4', owner: 'worker', url: 'about:blank', request_id: 'cr_1' });
  assert.equal(contextReport({ id: 4 }).request_id, undefined);
});
