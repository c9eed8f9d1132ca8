import assert from 'node:assert/strict';
import { test } from 'node:test';

import { CREATE_CODES, Creations, HOLD_MS } from '../src/lib/create.js';
import { buildReport, planPool } from '../src/lib/pool.js';

// fakeBrowser is the background page's side: worker tabs, the frames sent,
// and the state reports as the broker would read them.
function fakeBrowser({ capacity = 2, tabs = [1], openFails = null } = {}) {
  const b = { tabs: [...tabs], sent: [], reports: [], clock: 1000, nextId: 10, opened: [] };
  b.creations = new Creations({
    capacity: () => capacity,
    count: () => b.tabs.length,
    open: async (url, onOpened) => {
      if (openFails) throw new Error(openFails);
      const id = b.nextId++;
      b.opened.push({ id, url });
      onOpened(id);
      b.tabs.push(id);
      return { id };
    },
    report: () => b.reports.push(buildReport(b.tabs.map((id) => ({ id })), undefined, (id) => b.creations.requestId(id))),
    send: (f) => b.sent.push(f),
    now: () => b.clock,
  });
  return b;
}

test('create_context opens a tab at the URL and reports it at once with the request id', async () => {
  const b = fakeBrowser();
  const tabId = await b.creations.handle({ type: 'create_context', request_id: 'cr_1', url: 'http://127.0.0.1:9/page' });
  assert.equal(tabId, 10);
  assert.deepEqual(b.opened, [{ id: 10, url: 'http://127.0.0.1:9/page' }]);
  assert.deepEqual(b.sent, []);
  assert.deepEqual(b.reports, [[
    { context_id: 'tab-1', tab_id: '1', owner: 'worker' },
    { context_id: 'tab-10', tab_id: '10', owner: 'worker', request_id: 'cr_1' },
  ]]);
  assert.ok(b.creations.isExtra(10));
  assert.ok(!b.creations.isExtra(1));
});

test('without a URL the tab opens at about:blank', async () => {
  const b = fakeBrowser();
  await b.creations.handle({ type: 'create_context', request_id: 'cr_2' });
  assert.equal(b.opened[0].url, 'about:blank');
});

test('the request id is reported until the tab is leased, or until the broker has given up', async () => {
  const b = fakeBrowser({ capacity: 3 });
  await b.creations.handle({ type: 'create_context', request_id: 'cr_a' });
  await b.creations.handle({ type: 'create_context', request_id: 'cr_b' });
  assert.equal(b.creations.requestId(10), 'cr_a');
  assert.equal(b.creations.requestId(11), 'cr_b');
  b.creations.leased(10);
  assert.equal(b.creations.requestId(10), undefined);
  assert.ok(!b.creations.waits(10));
  assert.ok(b.creations.isExtra(10), 'a leased tab opened on request is still extra to the pool');
  b.clock += HOLD_MS - 1;
  assert.ok(b.creations.waits(11));
  b.clock += 1;
  assert.equal(b.creations.requestId(11), undefined, 'a creation the broker timed out is an ordinary tab');
  assert.ok(!b.creations.waits(11));
});

test('a full pool answers create_failed pool_full and opens nothing', async () => {
  const b = fakeBrowser({ capacity: 2, tabs: [1, 2] });
  assert.equal(await b.creations.handle({ type: 'create_context', request_id: 'cr_full', url: 'https://example.com/' }), null);
  assert.deepEqual(b.opened, []);
  assert.deepEqual(b.reports, []);
  assert.equal(b.sent.length, 1);
  assert.equal(b.sent[0].type, 'create_failed');
  assert.equal(b.sent[0].request_id, 'cr_full');
  assert.equal(b.sent[0].code, CREATE_CODES.POOL_FULL);
  assert.match(b.sent[0].message, /2 worker tabs/);
});

test('a URL a worker tab may not open answers create_failed invalid_params', async () => {
  for (const url of ['javascript:alert(1)', 'file:///etc/passwd', 'chrome://settings', 'not a url']) {
    const b = fakeBrowser();
    await b.creations.handle({ type: 'create_context', request_id: 'cr_bad', url });
    assert.deepEqual(b.opened, [], url);
    assert.deepEqual(b.sent.map((f) => [f.type, f.request_id, f.code]), [['create_failed', 'cr_bad', 'invalid_params']], url);
  }
});

test('a browser that will not open the tab answers create_failed open_failed', async () => {
  const b = fakeBrowser({ openFails: 'No window with id: 7.' });
  await b.creations.handle({ type: 'create_context', request_id: 'cr_gone' });
  assert.deepEqual(b.reports, []);
  assert.equal(b.sent[0].code, CREATE_CODES.OPEN_FAILED);
  assert.match(b.sent[0].message, /No window with id: 7/);
  assert.ok(!b.creations.waits(10));
});

test('a closed tab is forgotten', async () => {
  const b = fakeBrowser();
  await b.creations.handle({ type: 'create_context', request_id: 'cr_1' });
  b.creations.forget(10);
  assert.ok(!b.creations.isExtra(10));
  assert.equal(b.creations.requestId(10), undefined);
});

test('planPool: tabs opened on request are extra to the pool and close when no lease holds them', () => {
  const extra = (id) => id >= 10;
  // A leased extra stays; the pool keeps its size beside it.
  assert.deepEqual(planPool([1, 2, 10], 2, (id) => id === 10, extra), { create: 0, close: [] });
  // Released: it closes, and the pool is left alone.
  assert.deepEqual(planPool([1, 2, 10, 11], 2, (id) => id === 11, extra), { create: 0, close: [10] });
  // Extras never fill the pool.
  assert.deepEqual(planPool([1, 10], 2, () => true, extra), { create: 1, close: [] });
  assert.deepEqual(planPool([1, 2, 3, 10, 11], 2, () => false, extra), { create: 0, close: [11, 10, 3] });
});
