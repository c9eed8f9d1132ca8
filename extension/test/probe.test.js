import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';

import { httpURLOf, probeBroker } from '../src/lib/probe.js';
import { FakeClock, FakeWebSocket, flush, resetSockets } from '../testutil/fakes.js';

const URL_ = 'ws://127.0.0.1:8420/ws/v1/client';
beforeEach(resetSockets);

function probe(fetch) {
  const clock = new FakeClock();
  const p = probeBroker(URL_, { WebSocket: FakeWebSocket, fetch, timers: clock, timeoutMs: 5000 });
  return { p, clock, ws: FakeWebSocket.instances.at(-1) };
}

test('a socket that opens is a broker; it is closed at once, before hello', async () => {
  const { p, ws } = probe(async () => assert.fail('no HTTP when the socket opened'));
  ws.open();
  assert.deepEqual(await p, { ok: true });
  assert.equal(ws.closed.code, 1000);
  assert.equal(ws.sent.length, 0);
});

test('a socket that fails is explained over HTTP', async () => {
  const cases = [
    [async () => { throw new TypeError('Failed to fetch'); }, 'unreachable', /nothing answers at 127\.0\.0\.1:8420/],
    [async () => ({ status: 404 }), 'wrong_path', /nothing at \/ws\/v1\/client \(HTTP 404\)/],
    [async () => ({ status: 200 }), 'refused', /HTTP 200 but did not accept the WebSocket/],
  ];
  for (const [fetch, reason, msg] of cases) {
    const seen = [];
    const { p, ws } = probe(async (u, o) => {
      seen.push(u);
      return fetch(u, o);
    });
    ws.serverClose(1006);
    const r = await p;
    assert.equal(r.ok, false);
    assert.equal(r.reason, reason);
    assert.match(r.message, msg);
    assert.deepEqual(seen, ['http://127.0.0.1:8420/ws/v1/client']);
  }
});

test('no answer at all times out', async () => {
  const { p, clock } = probe(async () => assert.fail('no HTTP'));
  clock.advance(5000);
  await flush();
  const r = await p;
  assert.equal(r.reason, 'unreachable');
  assert.equal(httpURLOf('wss://b.example/x/ws/v1/client'), 'https://b.example/x/ws/v1/client');
});
