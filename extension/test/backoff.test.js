import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Backoff } from '../src/lib/backoff.js';

test('delays double up to the ceiling, with equal jitter', () => {
  const lo = new Backoff({ minMs: 1000, maxMs: 8000, random: () => 0 });
  assert.deepEqual([1, 2, 3, 4, 5, 6].map(() => lo.next()), [500, 1000, 2000, 4000, 4000, 4000]);
  const hi = new Backoff({ minMs: 1000, maxMs: 8000, random: () => 1 });
  assert.deepEqual([1, 2, 3, 4, 5].map(() => hi.next()), [1000, 2000, 4000, 8000, 8000]);
});

test('jitter stays within [ceiling/2, ceiling]', () => {
  const b = new Backoff({ minMs: 100, maxMs: 60000 });
  for (let i = 0; i < 200; i++) {
    const ceiling = b.ceiling();
    const d = b.next();
    assert.ok(d >= ceiling / 2 && d <= ceiling, `${d} not in [${ceiling / 2}, ${ceiling}]`);
  }
});

test('reset starts over; the attempt count can be restored', () => {
  const b = new Backoff({ minMs: 1000, maxMs: 60000, random: () => 1 });
  b.next();
  b.next();
  b.reset();
  assert.equal(b.next(), 1000);
  const restored = new Backoff({ minMs: 1000, maxMs: 60000, random: () => 1, attempt: 3 });
  assert.equal(restored.next(), 8000);
  const huge = new Backoff({ minMs: 1000, maxMs: 60000, random: () => 1, attempt: 5000 });
  assert.equal(huge.next(), 60000);
});

test('bad bounds are refused', () => {
  assert.throws(() => new Backoff({ minMs: 0 }));
  assert.throws(() => new Backoff({ minMs: 10, maxMs: 5 }));
});
