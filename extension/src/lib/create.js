// Creation on demand (DESIGN §10): the broker asks for a new context with
// create_context; the extension opens a worker tab at the URL and lists it
// in a state report at once, with the request's id on that tab's context
// object, or answers create_failed. No browser APIs: the background page
// hands in how to count, open and report tabs, so Node tests drive it.

import { CODES, createFailedFrame } from './protocol.js';
import { checkURL } from './commands.js';

// Codes of create_failed. invalid_params is the navigate command's code for
// a URL a worker tab may not open.
export const CREATE_CODES = Object.freeze({
  POOL_FULL: 'pool_full', // the extension has its pool and extra tabs open
  OPEN_FAILED: 'open_failed', // the browser would not open the tab or its window
  INVALID_PARAMS: CODES.INVALID_PARAMS,
});

// HOLD_MS is how long a tab opened on request keeps its request id (and is
// kept from being closed) while it waits for its lease: longer than the
// broker's longest creation timeout (60 s), after which the broker treats
// it as an ordinary idle context.
export const HOLD_MS = 65_000;

/**
 * Creations tracks the worker tabs opened on request.
 *
 * deps: capacity() is how many worker tabs the extension may hold (its
 * hello's max_contexts); count() how many it holds; open(url, onOpened)
 * opens a worker tab and calls onOpened(tabId) before the tab joins the
 * pool; report() sends the state now; send(frame) sends a frame.
 */
export class Creations {
  constructor({ capacity, count, open, report, send, now = Date.now }) {
    Object.assign(this, { capacity, count, open, report, send, now });
    this.waiting = new Map(); // tabId → {requestId, until}: not leased yet
    this.extra = new Set(); // tabIds opened on request, open still
  }

  /**
   * handle answers one create_context: a tab at its URL and a state report
   * naming it, or create_failed. Callers serialize it with whatever else
   * opens or closes worker tabs, so that the count is right.
   */
  async handle(f) {
    const fail = (code, message) => {
      this.send(createFailedFrame(f.request_id, code, message));
      return null;
    };
    let url = 'about:blank';
    if (f.url) {
      try {
        url = checkURL(f.url);
      } catch (e) {
        return fail(CREATE_CODES.INVALID_PARAMS, e.message);
      }
    }
    const cap = this.capacity();
    if (this.count() >= cap) return fail(CREATE_CODES.POOL_FULL, `this browser holds its ${cap} worker tabs already`);
    let tabId;
    try {
      const tab = await this.open(url, (id) => this.opened(id, f.request_id));
      tabId = tab.id;
    } catch (e) {
      return fail(CREATE_CODES.OPEN_FAILED, `could not open a worker tab: ${e?.message ?? e}`);
    }
    // Now, not when the page has loaded: the broker waits for this report.
    this.report();
    return tabId;
  }

  opened(tabId, requestId) {
    this.waiting.set(tabId, { requestId, until: this.now() + HOLD_MS });
    this.extra.add(tabId);
  }

  /**
   * requestId is the request id to report with tabId: from its opening
   * until it is leased or HOLD_MS passed, whichever comes first. The broker
   * reads it in the report that first lists the tab, and ignores it after.
   */
  requestId(tabId) {
    const w = this.waiting.get(tabId);
    if (!w) return undefined;
    if (this.now() >= w.until) {
      this.waiting.delete(tabId);
      return undefined;
    }
    return w.requestId;
  }

  /** waits reports whether tabId was opened on request and is not leased yet. */
  waits(tabId) {
    return this.requestId(tabId) !== undefined;
  }

  /** leased says the broker assigned tabId: its request is settled. */
  leased(tabId) {
    this.waiting.delete(tabId);
  }

  /** isExtra reports whether tabId was opened on request. */
  isExtra(tabId) {
    return this.extra.has(tabId);
  }

  /** forget drops a tab that closed. */
  forget(tabId) {
    this.waiting.delete(tabId);
    this.extra.delete(tabId);
  }
}
