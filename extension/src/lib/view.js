// What the popup and the options page say about the connection. Pure, so
// the wording is tested in Node.

const LABELS = {
  idle: 'Starting',
  unconfigured: 'Not set up',
  connecting: 'Connecting',
  connected: 'Connected',
  waiting: 'Reconnecting',
  halted: 'Stopped',
};

/** describeState gives the pill's label and class and a line of detail. */
export function describeState(s, now = Date.now(), { onOptions = false } = {}) {
  if (!s) return { label: 'Starting', cls: 'idle', detail: '' };
  const label = LABELS[s.state] ?? s.state;
  let detail = s.detail ?? '';
  if (s.state === 'waiting' && s.next_attempt_at) {
    const secs = Math.max(0, Math.ceil((s.next_attempt_at - now) / 1000));
    detail = `${detail ? detail + '. ' : ''}Next attempt in ${secs} s.`;
  } else if (s.state === 'connected') {
    const n = s.workers?.length ?? 0;
    const busy = (s.workers ?? []).filter((w) => w.task_id).length;
    detail = `${n} worker tab${n === 1 ? '' : 's'}, ${busy} under automation.`;
  } else if (s.state === 'unconfigured' && !detail) {
    detail = onOptions ? 'Fill in the broker URL and a client key below, then save.' : 'Open the options, set the broker URL and paste a client key.';
  }
  return { label, cls: s.state, detail };
}

/**
 * workerRows lists the worker tabs for the popup's table. Tasks show only
 * while connected: a mark from before a disconnect says nothing of now.
 */
export function workerRows(s) {
  const live = s?.state === 'connected';
  return (s?.workers ?? []).map((w) => ({
    tab: w.tab_id,
    page: w.title || w.url || 'about:blank',
    url: w.url || '',
    task: live ? w.task_id ?? null : null,
    epoch: live ? w.epoch ?? null : null,
    held: live ? w.held ?? null : null,
  }));
}

/** canReconnect says whether the popup offers Reconnect: only once set up. */
export function canReconnect(s) {
  return Boolean(s?.configured) && s.state !== 'connected' && s.state !== 'connecting';
}

/**
 * newerStatus reports whether status snapshot next is at least as new as
 * current, the one a page shows. A page gets snapshots by two paths, the
 * answer to its message and storage.session, and they can arrive out of
 * order: the answer to Give back, taken before the broker confirmed, after
 * the snapshot published once it did. Kept, the older one would show the
 * tab held until the next change. The worker numbers its snapshots (seq)
 * within one run of it (boot, when that run began).
 */
export function newerStatus(current, next) {
  if (!current || current.boot == null || next?.boot == null) return true;
  if (next.boot !== current.boot) return next.boot > current.boot;
  return next.seq >= current.seq;
}
