import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Marks } from '../src/lib/marks.js';

const a = (state, epoch, task = 't') => ({ type: 'assignment', context_id: 'tab-5', task_id: task, epoch, state });

test('assigned marks; every ending state clears', () => {
  for (const end of ['released', 'expired', 'revoked', 'context_gone']) {
    const m = new Marks();
    assert.equal(m.applyAssignment(a('assigned', 3), 10), 5);
    assert.deepEqual(m.get(5), { task_id: 't', epoch: 3, since: 10 });
    assert.equal(m.applyAssignment(a(end, 3)), 5, end);
    assert.equal(m.get(5), null);
  }
});

test('news of an older epoch never overrides a newer mark', () => {
  const m = new Marks();
  m.applyAssignment(a('assigned', 7, 'new'));
  assert.equal(m.applyAssignment(a('released', 6, 'old')), null);
  assert.equal(m.applyAssignment(a('assigned', 6, 'old')), null);
  assert.equal(m.get(5).task_id, 'new');
  assert.equal(m.applyAssignment(a('assigned', 7, 'new')), null); // a repeat changes nothing
});

test('commands mark their tab with their lease', () => {
  const m = new Marks();
  assert.equal(m.applyCommand(5, 'job', 4), 5);
  assert.equal(m.applyCommand(5, 'job', 4), null);
  assert.equal(m.applyCommand(5, 'older', 3), null);
  assert.equal(m.applyCommand(5, '', 9), null);
  assert.equal(m.get(5).task_id, 'job');
  assert.equal(m.applyAssignment(a('released', 4, 'job')), 5);
});

test('unknown contexts and states change nothing', () => {
  const m = new Marks();
  assert.equal(m.applyAssignment({ context_id: 'flow-1', task_id: 't', epoch: 1, state: 'assigned' }), null);
  assert.equal(m.applyAssignment(a('paused', 1)), null);
  assert.equal(m.applyAssignment(a('released', 1)), null);
});

test('clear and forget', () => {
  const m = new Marks();
  m.applyCommand(1, 'a', 1);
  m.applyCommand(2, 'b', 2);
  assert.equal(m.forget(1), true);
  assert.equal(m.forget(1), false);
  assert.deepEqual(m.clear(), [2]);
  assert.deepEqual(m.entries(), []);
});
