// Marks: which worker tab is under automation, for which task. They come
// from assignment frames ("assigned" marks; "released", "expired",
// "revoked" and "context_gone" clear) and from command frames, which carry
// the task and epoch of the lease they were sent under. Epochs only grow, so
// news about an older epoch never overrides a newer mark.

import { tabIdForContext } from './protocol.js';

export const ENDED_STATES = Object.freeze(['released', 'expired', 'revoked', 'context_gone']);

/**
 * ByTab is a state kept per worker tab (a mark, a person's hold): get,
 * forget a tab that is gone, clear them all when the session ends.
 */
export class ByTab {
  constructor(entries) {
    this.byTab = new Map(entries ?? []);
  }

  get(tabId) {
    return this.byTab.get(tabId) ?? null;
  }

  /** forget drops the state of a tab that is gone; it reports a change. */
  forget(tabId) {
    return this.byTab.delete(tabId);
  }

  /** clear drops every state and returns the tab ids that had one. */
  clear() {
    const ids = [...this.byTab.keys()];
    this.byTab.clear();
    return ids;
  }
}

/** Marks are the tabs under automation: tabId → {task_id, epoch, since}. */
export class Marks extends ByTab {

  /**
   * applyAssignment records an assignment frame. It returns the tab id whose
   * mark changed, or null when nothing changed.
   */
  applyAssignment(a, now = Date.now()) {
    const tabId = tabIdForContext(a.context_id);
    if (tabId === null) return null;
    const cur = this.byTab.get(tabId);
    const epoch = Number(a.epoch) || 0;
    if (a.state === 'assigned') {
      if (cur && cur.epoch > epoch) return null;
      if (cur && cur.epoch === epoch && cur.task_id === a.task_id) return null;
      this.byTab.set(tabId, { task_id: a.task_id, epoch, since: now });
      return tabId;
    }
    if (ENDED_STATES.includes(a.state)) {
      if (!cur || cur.epoch > epoch) return null;
      this.byTab.delete(tabId);
      return tabId;
    }
    return null; // a state of a newer protocol: nothing to show
  }

  /**
   * applyCommand marks the tab a command was sent to with its lease, unless
   * a newer lease already marks it. It returns the tab id when the mark
   * changed.
   */
  applyCommand(tabId, taskId, epoch, now = Date.now()) {
    if (typeof taskId !== 'string' || taskId === '') return null;
    epoch = Number(epoch) || 0;
    const cur = this.byTab.get(tabId);
    if (cur && cur.epoch >= epoch) return null;
    this.byTab.set(tabId, { task_id: taskId, epoch, since: now });
    return tabId;
  }


  entries() {
    return [...this.byTab.entries()];
  }
}
