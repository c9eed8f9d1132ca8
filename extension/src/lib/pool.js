// The worker pool, as data: which tabs to open or close to keep the pool at
// its size, and the state report that describes it. Pure: no browser APIs.

import { contextReport } from './protocol.js';

export const DEFAULT_POOL_SIZE = 2;
export const MAX_POOL_SIZE = 16;

/** checkPoolSize returns n as a pool size or throws. */
export function checkPoolSize(n) {
  const v = typeof n === 'string' && /^\s*\d+\s*$/.test(n) ? Number(n) : n;
  if (!Number.isInteger(v) || v < 0 || v > MAX_POOL_SIZE) {
    throw new Error(`the pool size must be a whole number from 0 to ${MAX_POOL_SIZE}`);
  }
  return v;
}

/**
 * planPool says how to bring the pool to size: how many tabs to open, and
 * which tabs to close. Only tabs under no lease are closed, the most
 * recently opened first; a pool whose leased tabs alone exceed the size
 * shrinks as their leases end.
 */
export function planPool(workerIds, size, isLeased = () => false) {
  const n = workerIds.length;
  if (n < size) return { create: size - n, close: [] };
  const close = [];
  for (let i = n - 1; i >= 0 && n - close.length > size; i--) {
    if (!isLeased(workerIds[i])) close.push(workerIds[i]);
  }
  return { create: 0, close };
}

/**
 * buildReport is the full list of contexts for a state frame: one per
 * worker tab, in tab order. A person's tabs are never in it.
 */
export function buildReport(workerTabs, labels) {
  return [...workerTabs]
    .sort((a, b) => a.id - b.id)
    .map((t) => contextReport(t, labels));
}

/** reportKey identifies a report, to skip sending the same one twice. */
export function reportKey(contexts) {
  return JSON.stringify(contexts);
}
