// The worker pool, as data: which tabs to open or close to keep the pool at
// its size, and the state report that describes it. Pure: no browser APIs.

import { contextReport } from './protocol.js';

export const DEFAULT_POOL_SIZE = 2;
export const MAX_POOL_SIZE = 16;

/** checkPoolSize returns n as a pool size (or a count of extra tabs, what) or throws. */
export function checkPoolSize(n, what = 'the pool size') {
  const v = typeof n === 'string' && /^\s*\d+\s*$/.test(n) ? Number(n) : n;
  if (!Number.isInteger(v) || v < 0 || v > MAX_POOL_SIZE) {
    throw new Error(`${what} must be a whole number from 0 to ${MAX_POOL_SIZE}`);
  }
  return v;
}

/**
 * planPool says how to bring the pool to size: how many tabs to open, and
 * which tabs to close. Only tabs under no lease are closed, the most
 * recently opened first; a pool whose leased tabs alone exceed the size
 * shrinks as their leases end. Tabs opened on request (isExtra, DESIGN §10
 * creation on demand) are not part of the pool: they never count towards
 * its size, and each closes once it is under no lease.
 */
export function planPool(workerIds, size, isLeased = () => false, isExtra = () => false) {
  const pool = workerIds.filter((id) => !isExtra(id));
  const close = workerIds.filter((id) => isExtra(id) && !isLeased(id)).reverse();
  const n = pool.length;
  if (n < size) return { create: size - n, close };
  let kept = n;
  for (let i = n - 1; i >= 0 && kept > size; i--) {
    if (!isLeased(pool[i])) {
      close.push(pool[i]);
      kept--;
    }
  }
  return { create: 0, close };
}

/**
 * buildReport is the full list of contexts for a state frame: one per
 * worker tab, in tab order. A person's tabs are never in it. requestIdOf
 * names the create_context a tab was opened for, if any.
 */
export function buildReport(workerTabs, labels, requestIdOf = () => undefined) {
  return [...workerTabs]
    .sort((a, b) => a.id - b.id)
    .map((t) => contextReport(t, labels, requestIdOf(t.id)));
}

/** reportKey identifies a report, to skip sending the same one twice. */
export function reportKey(contexts) {
  return JSON.stringify(contexts);
}
