import assert from 'node:assert/strict';
import { test } from 'node:test';

import { canReconnect, describeState, newerStatus, workerRows } from '../src/lib/view.js';

test('the popup names each state', () => {
  assert.equal(describeState(null).label, 'Starting');
  const s = { state: 'connected', workers: [{ tab_id: '1', task_id: 't' }, { tab_id: '2', task_id: null }] };
  assert.deepEqual(describeState(s), { label: 'Connected', cls: 'connected', detail: '2 worker tabs, 1 under automation.' });
  assert.equal(describeState({ state: 'waiting', detail: 'lost', next_attempt_at: 5500 }, 1000).detail, 'lost. Next attempt in 5 s.');
  assert.equal(describeState({ state: 'halted', detail: 'the broker refused the client key' }).label, 'Stopped');
  assert.match(describeState({ state: 'unconfigured' }).detail, /Open the options/);
  assert.match(describeState({ state: 'unconfigured' }, 0, { onOptions: true }).detail, /below/);
  assert.doesNotMatch(describeState({ state: 'unconfigured' }, 0, { onOptions: true }).detail, /options/);
});

test('Reconnect is offered only once set up and not connected', () => {
  assert.equal(canReconnect({ state: 'unconfigured', configured: false }), false);
  assert.equal(canReconnect({ state: 'halted', configured: true }), true);
  assert.equal(canReconnect({ state: 'connected', configured: true }), false);
  assert.equal(canReconnect(null), false);
});

test('tasks are listed only while connected', () => {
  const w = [{ tab_id: '1', url: 'https://e/', title: 'E', task_id: 'job', epoch: 3 }];
  assert.equal(workerRows({ state: 'connected', workers: w })[0].task, 'job');
  assert.equal(workerRows({ state: 'waiting', workers: w })[0].task, null);
});

test('worker rows show the task holding each tab', () => {
  const rows = workerRows({ state: 'connected', workers: [
    { tab_id: '1', url: 'https://e/', title: '', task_id: 'job', epoch: 3 },
    { tab_id: '2', url: '', title: '', task_id: null },
  ] });
  assert.deepEqual(rows, [
    { tab: '1', page: 'https://e/', url: 'https://e/', task: 'job', epoch: 3, held: null },
    { tab: '2', page: 'about:blank', url: '', task: null, epoch: null, held: null },
  ]);
});

test('worker rows show a person\'s hold, only while connected', () => {
  const w = [{ tab_id: '1', url: '', title: '', task_id: 'job', epoch: 3, held: { state: 'active', until: 1 } }];
  assert.deepEqual(workerRows({ state: 'connected', workers: w })[0].held, { state: 'active', until: 1 });
  assert.equal(workerRows({ state: 'waiting', workers: w })[0].held, null);
});

test('a page keeps the newest status whichever way it came', () => {
  const held = { boot: 100, seq: 7, workers: [{ tab_id: '1', held: { state: 'active' } }] };
  const givenBack = { boot: 100, seq: 8, workers: [{ tab_id: '1', held: null }] };
  assert.equal(newerStatus(null, held), true, 'the first status is taken');
  assert.equal(newerStatus(held, givenBack), true);
  assert.equal(newerStatus(givenBack, held), false, 'an answer taken before the last publish is older news');
  assert.equal(newerStatus(givenBack, givenBack), true, 'the same snapshot again is shown again');
  assert.equal(newerStatus(givenBack, { boot: 200, seq: 1 }), true, 'a worker started since numbers afresh');
  assert.equal(newerStatus({ boot: 200, seq: 1 }, givenBack), false, 'and what its predecessor said is older');
  assert.equal(newerStatus({ state: 'connected' }, givenBack), true, 'a status without numbers orders nothing');
});
