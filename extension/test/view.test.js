import assert from 'node:assert/strict';
import { test } from 'node:test';

import { describeState, workerRows } from '../src/lib/view.js';

test('the popup names each state', () => {
  assert.equal(describeState(null).label, 'Starting');
  const s = { state: 'connected', workers: [{ tab_id: '1', task_id: 't' }, { tab_id: '2', task_id: null }] };
  assert.deepEqual(describeState(s), { label: 'Connected', cls: 'connected', detail: '2 worker tabs, 1 under automation.' });
  assert.equal(describeState({ state: 'waiting', detail: 'lost', next_attempt_at: 5500 }, 1000).detail, 'lost. Next attempt in 5 s.');
  assert.equal(describeState({ state: 'halted', detail: 'the broker refused the client key' }).label, 'Stopped');
  assert.match(describeState({ state: 'unconfigured' }).detail, /client key/);
});

test('worker rows show the task holding each tab', () => {
  const rows = workerRows({ workers: [
    { tab_id: '1', url: 'https://e/', title: '', task_id: 'job', epoch: 3 },
    { tab_id: '2', url: '', title: '', task_id: null },
  ] });
  assert.deepEqual(rows, [
    { tab: '1', page: 'https://e/', url: 'https://e/', task: 'job', epoch: 3 },
    { tab: '2', page: 'about:blank', url: '', task: null, epoch: null },
  ]);
});
