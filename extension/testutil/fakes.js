// Fakes for the unit tests: a WebSocket the test drives by hand, and timers
// on a clock the test advances.

export class FakeWebSocket {
  static instances = [];

  constructor(url) {
    this.url = url;
    this.readyState = 0;
    this.sent = [];
    this.closed = null;
    FakeWebSocket.instances.push(this);
  }

  send(s) {
    if (this.readyState !== 1) throw new Error('InvalidStateError: not open');
    this.sent.push(JSON.parse(s));
  }

  close(code, reason) {
    this.closed = { code, reason };
    this.readyState = 3;
  }

  // What the network does:
  open() {
    this.readyState = 1;
    this.onopen?.({});
  }

  receive(frame) {
    this.onmessage?.({ data: typeof frame === 'string' ? frame : JSON.stringify(frame) });
  }

  serverClose(code, reason = '') {
    this.readyState = 3;
    this.onclose?.({ code, reason });
  }

  sentOfType(type) {
    return this.sent.filter((f) => f.type === type);
  }
}

export function resetSockets() {
  FakeWebSocket.instances.length = 0;
}

/** FakeClock is a clock with timers that fire only when advanced. */
export class FakeClock {
  constructor(start = 1_000_000) {
    this.t = start;
    this.nextId = 1;
    this.timers = new Map(); // id → {at, fn, every}
    this.now = () => this.t;
    this.setTimeout = (fn, ms) => this.add(fn, ms, 0);
    this.setInterval = (fn, ms) => this.add(fn, ms, ms);
    this.clearTimeout = (id) => this.timers.delete(id);
    this.clearInterval = (id) => this.timers.delete(id);
  }

  add(fn, ms, every) {
    const id = this.nextId++;
    this.timers.set(id, { at: this.t + Math.max(0, ms), fn, every });
    return id;
  }

  /** advance moves the clock, firing due timers in time order. */
  advance(ms) {
    const end = this.t + ms;
    for (;;) {
      let nextId = null;
      let next = null;
      for (const [id, tm] of this.timers) {
        if (tm.at <= end && (next === null || tm.at < next.at)) {
          next = tm;
          nextId = id;
        }
      }
      if (next === null) break;
      this.t = next.at;
      if (next.every > 0) next.at += next.every;
      else this.timers.delete(nextId);
      next.fn();
    }
    this.t = end;
  }

  pending() {
    return this.timers.size;
  }
}

/** flush lets pending promise callbacks run. */
export async function flush() {
  for (let i = 0; i < 10; i++) await Promise.resolve();
}
