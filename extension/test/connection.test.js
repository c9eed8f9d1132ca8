import assert from 'node:assert/strict';
import { beforeEach, test } from 'node:test';

import { Backoff } from '../src/lib/backoff.js';
import { Connection } from '../src/lib/connection.js';
import { FakeClock, FakeWebSocket, flush, resetSockets } from '../testutil/fakes.js';

const cfg = {
  url: 'ws://127.0.0.1:8420/ws/v1/client', token: 'chk_k', clientId: 'ext-1', name: 'n', version: '0.1.0',
  labels: {}, maxContexts: 2,
};
const welcome = { type: 'welcome', protocol: 1, session_id: 's1', user_id: 'usr_1', heartbeat_s: 20, max_message_bytes: 4096 };

function setup(over = {}) {
  const clock = new FakeClock();
  const events = { welcomes: 0, frames: [], statuses: [], schedules: [], cancels: 0, reconnect: [], halts: [] };
  const conn = new Connection({
    WebSocket: FakeWebSocket,
    getConfig: async () => cfg,
    timers: clock,
    now: clock.now,
    backoff: new Backoff({ minMs: 1000, maxMs: 60000, random: () => 1 }),
    scheduleReconnect: (delay, at) => events.schedules.push({ delay, at }),
    cancelReconnect: () => events.cancels++,
    onWelcome: () => events.welcomes++,
    onFrame: (f) => events.frames.push(f),
    onStatus: (s) => events.statuses.push(s.state),
    onReconnectState: (r) => events.reconnect.push(r),
    onHalt: (h) => events.halts.push(h),
    ...over,
  });
  return { conn, clock, events };
}

async function connected(over) {
  const s = setup(over);
  await s.conn.connect();
  const ws = FakeWebSocket.instances.at(-1);
  ws.open();
  ws.receive(welcome);
  return { ...s, ws };
}

beforeEach(resetSockets);

test('hello first, then welcome makes the connection usable', async () => {
  const { conn, events } = setup();
  await conn.connect();
  const ws = FakeWebSocket.instances[0];
  assert.equal(ws.url, cfg.url);
  assert.equal(conn.state, 'connecting');
  assert.equal(conn.send({ type: 'state', contexts: [] }), false); // not before open
  ws.open();
  assert.deepEqual(ws.sent, [{
    type: 'hello', protocol: 1, token: 'chk_k', client_id: 'ext-1', client_type: 'browser', name: 'n',
    version: '0.1.0', capacity: { max_contexts: 2 },
  }]);
  assert.equal(conn.send({ type: 'state', contexts: [] }), false); // not before welcome
  ws.receive(welcome);
  assert.equal(conn.state, 'connected');
  assert.equal(conn.status.userId, 'usr_1');
  assert.equal(conn.maxMessageBytes, 4096);
  assert.equal(events.welcomes, 1);
  assert.equal(conn.send({ type: 'state', contexts: [] }), true);
  assert.deepEqual(ws.sent.at(-1), { type: 'state', contexts: [] });
});

test('frames after welcome reach onFrame; pongs do not', async () => {
  const { ws, events, conn } = await connected();
  ws.receive({ type: 'pong' });
  ws.receive({ type: 'command', command_id: 'c1', name: 'navigate', context_id: 'tab-1' });
  ws.receive({ type: 'assignment', context_id: 'tab-1', task_id: 't', epoch: 1, state: 'assigned' });
  ws.receive('not json');
  ws.receive({ type: 'error', code: 'unknown_type', message: 'x' });
  assert.deepEqual(events.frames.map((f) => f.type), ['command', 'assignment', 'error']);
  assert.deepEqual(conn.brokerError, { code: 'unknown_type', message: 'x' });
});

test('a ping every 20 s; a broker silent for three heartbeats is dropped', async () => {
  const { ws, clock, conn, events } = await connected();
  clock.advance(20000);
  assert.equal(ws.sentOfType('ping').length, 1);
  ws.receive({ type: 'pong' });
  clock.advance(20000);
  assert.equal(ws.sentOfType('ping').length, 2);
  // No answer any more.
  clock.advance(60000);
  assert.ok(ws.closed, 'the silent socket was closed');
  assert.equal(conn.state, 'waiting');
  assert.equal(events.schedules.length, 1);
  // Its close event, arriving late, does not count twice.
  ws.serverClose(1006);
  assert.equal(events.schedules.length, 1);
});

test('reconnects with exponential backoff, and welcome resets it', async () => {
  const { conn, ws, events, clock } = await connected();
  ws.serverClose(1006);
  assert.equal(conn.state, 'waiting');
  for (let i = 0; i < 3; i++) {
    await conn.connect(); // what the reconnect alarm does
    FakeWebSocket.instances.at(-1).serverClose(1006);
  }
  assert.deepEqual(events.schedules.map((s) => s.delay), [1000, 2000, 4000, 8000]);
  assert.equal(events.schedules[0].at, clock.now() + 1000);
  assert.deepEqual(events.reconnect.at(-1), { attempt: 4, nextAttemptAt: clock.now() + 8000 });
  await conn.connect();
  const last = FakeWebSocket.instances.at(-1);
  last.open();
  last.receive(welcome);
  assert.equal(conn.backoff.attempt, 0);
  assert.equal(events.reconnect.at(-1), null);
  last.serverClose(1001, 'going away');
  assert.equal(events.schedules.at(-1).delay, 1000);
});

test('a permanent close halts: no reconnect', async () => {
  for (const code of [4401, 4403, 4409]) {
    resetSockets();
    const { conn, ws, events } = await connected();
    ws.serverClose(code);
    assert.equal(conn.state, 'halted', String(code));
    assert.equal(conn.status.closeCode, code);
    assert.equal(events.schedules.length, 0);
    assert.equal(events.halts.length, 1);
  }
});

test('the error frame before a close says why, even when the code is lost', async () => {
  const { conn, events } = setup();
  await conn.connect();
  const ws = FakeWebSocket.instances[0];
  ws.open();
  ws.receive({ type: 'error', code: 'unauthorized', message: 'hello needs a valid client key' });
  ws.serverClose(1006);
  assert.equal(conn.state, 'halted');
  assert.equal(conn.status.closeCode, 4401);
  assert.match(conn.status.detail, /valid client key/);
  assert.equal(events.welcomes, 0);
});

test('a stale socket never replaces a newer one', async () => {
  const { conn, events } = setup();
  await conn.connect();
  const old = FakeWebSocket.instances[0];
  await conn.connect();
  const fresh = FakeWebSocket.instances[1];
  assert.deepEqual(old.closed, { code: 1000, reason: 'reconnecting' });
  // The old socket's events, however late, do nothing.
  old.readyState = 1;
  old.onopen?.({});
  old.onmessage?.({ data: JSON.stringify(welcome) });
  old.onclose?.({ code: 1006 });
  assert.equal(old.sent.length, 0);
  assert.equal(conn.state, 'connecting');
  assert.equal(events.schedules.length, 0);
  fresh.open();
  fresh.receive(welcome);
  assert.equal(conn.state, 'connected');
  assert.equal(conn.ws, fresh);
});

test('overlapping connects: only the newest opens a socket', async () => {
  let release;
  const slow = new Promise((r) => {
    release = r;
  });
  let calls = 0;
  const { conn } = setup({
    getConfig: () => (++calls === 1 ? slow.then(() => cfg) : Promise.resolve(cfg)),
  });
  const first = conn.connect(); // still reading its configuration
  await conn.connect();
  release();
  await first;
  assert.equal(FakeWebSocket.instances.length, 1);
  assert.equal(conn.gen, 2);
});

test('no broker URL or key: unconfigured, no socket', async () => {
  const { conn, events } = setup({ getConfig: async () => null });
  await conn.connect();
  assert.equal(conn.state, 'unconfigured');
  assert.equal(FakeWebSocket.instances.length, 0);
  assert.equal(events.schedules.length, 0);
  const bad = setup({ getConfig: async () => { throw new Error('the broker URL must start with http'); } });
  await bad.conn.connect();
  assert.equal(bad.conn.state, 'unconfigured');
  assert.match(bad.conn.status.detail, /http/);
});

test('no welcome in time: give up and retry', async () => {
  const { conn, clock, events } = setup();
  await conn.connect();
  const ws = FakeWebSocket.instances[0];
  ws.open();
  clock.advance(15000);
  assert.ok(ws.closed);
  assert.equal(conn.state, 'waiting');
  assert.equal(events.schedules.length, 1);
});

test('a socket that cannot even be made is retried', async () => {
  class Throwing {
    constructor() {
      throw new SyntaxError('bad URL');
    }
  }
  const { conn, events } = setup({ WebSocket: Throwing });
  await conn.connect();
  assert.equal(conn.state, 'waiting');
  assert.equal(events.schedules.length, 1);
});

test('halt and stop close the socket and cancel the reconnect', async () => {
  const { conn, ws, events } = await connected();
  const cancels = events.cancels;
  conn.halt('disconnected by an admin', 4403);
  assert.ok(ws.closed);
  assert.equal(conn.state, 'halted');
  assert.equal(events.cancels, cancels + 1);
  ws.onclose?.({ code: 1000 }); // detached: nothing happens
  assert.equal(conn.state, 'halted');
  await flush();
});

test('frames too large for the broker are not sent as they are', async () => {
  const { conn, ws } = await connected();
  assert.equal(conn.send({ type: 'result', command_id: 'c1', data: { content: 'x'.repeat(5000) } }), true);
  assert.equal(ws.sent.at(-1).type, 'error');
  assert.equal(ws.sent.at(-1).code, 'too_large');
  assert.equal(conn.send({ type: 'capture', command_id: 'c1', mime: 'image/png', data: 'x'.repeat(5000) }), false);
});

test('waitUntil honours a delay chosen before a restart', () => {
  const { conn, clock, events } = setup();
  conn.waitUntil(clock.now() + 7000, 'waiting to reconnect');
  assert.equal(conn.state, 'waiting');
  assert.deepEqual(events.schedules, [{ delay: 7000, at: clock.now() + 7000 }]);
});

test('a wss:// connection that never opens says the certificate may be why', async () => {
  const { conn } = setup({ getConfig: async () => ({ ...cfg, url: 'wss://broker.example.com/ws/v1/client' }) });
  await conn.connect();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  assert.equal(conn.state, 'waiting');
  assert.match(conn.status.detail, /TLS.*certificate this browser trusts/);

  // Over ws://, or once a wss:// connection opened, the loss is just a loss.
  const plain = setup();
  await plain.conn.connect();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  assert.doesNotMatch(plain.conn.status.detail, /certificate/);
  const opened = setup({ getConfig: async () => ({ ...cfg, url: 'wss://broker.example.com/ws/v1/client' }) });
  await opened.conn.connect();
  const ws = FakeWebSocket.instances.at(-1);
  ws.open();
  ws.serverClose(1006);
  assert.doesNotMatch(opened.conn.status.detail, /certificate/);
});

test('a socket that never opened says it could not connect, not that it was lost', async () => {
  const { conn } = setup();
  await conn.connect();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  assert.equal(conn.status.state, 'waiting');
  assert.match(conn.status.detail, /^could not connect to ws:\/\/127\.0\.0\.1:8420\/ws\/v1\/client: no broker answered there/);
  assert.doesNotMatch(conn.status.detail, /lost/);
  const { conn: c2 } = await connected();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  assert.match(c2.status.detail, /the connection was lost/);
});

test('a socket that never opened is diagnosed, while the attempt is still the current one', async () => {
  let answer;
  const { conn, events } = setup({ diagnose: () => new Promise((r) => { answer = r; }) });
  await conn.connect();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  const before = events.statuses.length;
  answer('127.0.0.1:8420 answered, but has nothing at /ws/v1/client (HTTP 404): is the path right?');
  await flush();
  assert.equal(conn.status.state, 'waiting');
  assert.equal(conn.status.detail, 'could not connect to ws://127.0.0.1:8420/ws/v1/client: 127.0.0.1:8420 answered, but has nothing at /ws/v1/client (HTTP 404): is the path right?');
  assert.equal(events.statuses.length, before + 1);
  // A diagnosis that comes after the next attempt started says nothing.
  const s2 = setup({ diagnose: () => new Promise((r) => { answer = r; }) });
  await s2.conn.connect();
  FakeWebSocket.instances.at(-1).serverClose(1006);
  await s2.conn.connect();
  answer('late');
  await flush();
  assert.equal(s2.conn.status.state, 'connecting');
});
