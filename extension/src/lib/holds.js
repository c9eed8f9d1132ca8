// Human control (DESIGN §10): a person takes over a worker tab from the
// popup ("Take control") and gives it back ("Give back"), or from the tab
// itself: the page action (the page's context menu, or Alt+Shift+H). While the hold
// lasts the broker refuses applications' mutations on the tab (held) and
// lets observations through. Pure, so it is tested in Node; background.js
// wires it to Chrome and the connection.

import { ByTab } from './marks.js';
import { contextIdForTab, tabIdForContext } from './protocol.js';

/** The popup's timer: how long a hold lasts unless given back (ttl_s). */
export const DEFAULT_HOLD_MINUTES = 5;
export const MAX_HOLD_MINUTES = 60;

export const HELD_TEXT = 'YOU';
export const HELD_COLOR = '#2471a3';

/** Holds tracks the holds this extension asked for: tabId → {state, until}. */
export class Holds extends ByTab {
  /**
   * take returns the hold frame for tabId, for minutes (clamped to 1 to
   * MAX_HOLD_MINUTES), and marks the tab as asked for until the broker
   * answers.
   */
  take(tabId, minutes = DEFAULT_HOLD_MINUTES, now = Date.now()) {
    const m = Math.min(MAX_HOLD_MINUTES, Math.max(1, Math.round(Number(minutes) || DEFAULT_HOLD_MINUTES)));
    this.byTab.set(tabId, { state: this.byTab.get(tabId)?.state ?? 'asked', until: now + m * 60000 });
    return { type: 'hold', context_id: contextIdForTab(tabId), ttl_s: m * 60 };
  }

  /** give returns the unhold frame for tabId. */
  give(tabId) {
    return { type: 'unhold', context_id: contextIdForTab(tabId) };
  }

  /** apply takes a hold_state frame and returns the tab it is about, or null. */
  apply(f) {
    const tabId = tabIdForContext(f.context_id);
    if (tabId === null) return null;
    if (f.state === 'ended') {
      if (!this.byTab.delete(tabId)) return null;
    } else {
      const h = this.byTab.get(tabId) ?? { until: null };
      this.byTab.set(tabId, { ...h, state: f.state });
    }
    return tabId;
  }

}

/** holdBadge is the badge of a held tab: who drives it now. */
export function holdBadge(h) {
  const waiting = h.state !== 'active';
  return {
    text: HELD_TEXT,
    color: HELD_COLOR,
    title: waiting
      ? 'Cheetah: you are taking control of this tab (waiting for the automation\'s running commands to end)'
      : 'Cheetah: you drive this tab; automation may only read it until you give it back',
  };
}

/** holdLabel is what the popup shows of a tab's hold. */
export function holdLabel(h, now = Date.now()) {
  if (!h) return '';
  const left = h.until ? Math.max(0, Math.ceil((h.until - now) / 60000)) : null;
  const what = h.state === 'active' ? 'you drive it' : 'taking control…';
  return left === null ? what : `${what} (${left} min left)`;
}

/** PAGE_ACTION_MENU is the id of the page action's context-menu item. */
export const PAGE_ACTION_MENU = 'cheetah-control';
/** PAGE_ACTION_COMMAND is the manifest command (a keyboard shortcut) of the page action. */
export const PAGE_ACTION_COMMAND = 'toggle-control';

/**
 * pageAction is what the page action offers on a tab: Take control on a
 * worker tab nobody holds (disabled while the broker is away: a hold is
 * the broker's), Give back on a tab the person holds (always: a give-back
 * must never be out of reach), and nothing on any other tab.
 */
export function pageAction({ worker, held, connected }) {
  if (!worker) return { visible: false, enabled: false, action: null, title: 'Cheetah: take control of this tab' };
  if (held) return { visible: true, enabled: true, action: 'unhold', title: 'Cheetah: give this tab back to automation' };
  return { visible: true, enabled: Boolean(connected), action: connected ? 'hold' : null,
    title: connected ? 'Cheetah: take control of this tab' : 'Cheetah: take control of this tab (not connected to the broker)' };
}
