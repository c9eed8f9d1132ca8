import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Mutex, SerialQueues } from '../src/lib/queue.js';

function gate() {
  let open;
  const p = new Promise((r) => {
    open = r;
  });
  return { p, open };
}

test('tasks of one key run one at a time, in order', async () => {
  const q = new SerialQueues();
  const log = [];
  const g = gate();
  const a = q.run(1, async () => {
    log.push('a start');
    await g.p;
    log.push('a end');
    return 'a';
  });
  const b = q.run(1, async () => {
    log.push('b');
    return 'b';
  });
  const other = q.run(2, async () => {
    log.push('other');
  });
  await other;
  assert.deepEqual(log, ['a start', 'other']); // another key is not blocked
  assert.equal(q.pending(1), 2);
  g.open();
  assert.equal(await a, 'a');
  assert.equal(await b, 'b');
  assert.deepEqual(log, ['a start', 'other', 'a end', 'b']);
  await q.idle();
  assert.equal(q.pending(1), 0);
  assert.equal(q.tails.size, 0); // nothing kept once a key is done
});

test('a failing task does not stop the ones behind it', async () => {
  const q = new SerialQueues();
  const a = q.run('k', async () => {
    throw new Error('boom');
  });
  const b = q.run('k', async () => 'fine');
  await assert.rejects(a, /boom/);
  assert.equal(await b, 'fine');
});

test('Mutex runs one task at a time', async () => {
  const m = new Mutex();
  let running = 0;
  let most = 0;
  await Promise.all([1, 2, 3].map(() => m.run(async () => {
    running++;
    most = Math.max(most, running);
    await Promise.resolve();
    running--;
  })));
  assert.equal(most, 1);
});
