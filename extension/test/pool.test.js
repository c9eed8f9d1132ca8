import assert from 'node:assert/strict';
import { test } from 'node:test';

import { MAX_POOL_SIZE, buildReport, checkPoolSize, planPool, reportKey } from '../src/lib/pool.js';

test('planPool opens what is missing', () => {
  assert.deepEqual(planPool([], 2), { create: 2, close: [] });
  assert.deepEqual(planPool([1], 3), { create: 2, close: [] });
  assert.deepEqual(planPool([1, 2], 2), { create: 0, close: [] });
});

test('planPool closes the newest idle tabs, never a leased one', () => {
  assert.deepEqual(planPool([1, 2, 3, 4], 2), { create: 0, close: [4, 3] });
  assert.deepEqual(planPool([1, 2, 3, 4], 2, (id) => id === 4), { create: 0, close: [3, 2] });
  assert.deepEqual(planPool([1, 2, 3], 0, () => true), { create: 0, close: [] });
  assert.deepEqual(planPool([1, 2, 3], 0), { create: 0, close: [3, 2, 1] });
});

test('the report lists worker tabs only, in tab order', () => {
  const report = buildReport([
    { id: 9, url: 'https://b/', title: 'B' },
    { id: 3, url: '', title: '' },
  ]);
  assert.deepEqual(report, [
    { context_id: 'tab-3', tab_id: '3', owner: 'worker' },
    { context_id: 'tab-9', tab_id: '9', owner: 'worker', url: 'https://b/', title: 'B' },
  ]);
  assert.ok(report.every((c) => c.owner === 'worker'));
  assert.equal(reportKey(report), reportKey(buildReport([{ id: 3 }, { id: 9, url: 'https://b/', title: 'B' }])));
});

test('pool sizes', () => {
  assert.equal(checkPoolSize('3'), 3);
  assert.equal(checkPoolSize(0), 0);
  assert.equal(checkPoolSize(MAX_POOL_SIZE), MAX_POOL_SIZE);
  for (const bad of [-1, 17, 1.5, 'x', '', null]) assert.throws(() => checkPoolSize(bad), String(bad));
});
