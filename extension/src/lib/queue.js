// SerialQueues runs the tasks of one key one at a time, in the order they
// were added, and tasks of different keys independently. The extension keys
// by tab, so that a tab executes its commands one at a time, in order
// (invariant 7), while other tabs work in parallel.

export class SerialQueues {
  constructor() {
    this.tails = new Map(); // key → promise of the last task's end
    this.counts = new Map(); // key → tasks added and not yet finished
  }

  /** run queues fn under key and returns a promise of its outcome. */
  run(key, fn) {
    const prev = this.tails.get(key) ?? Promise.resolve();
    this.counts.set(key, (this.counts.get(key) ?? 0) + 1);
    const result = prev.then(() => fn());
    const tail = result.then(() => {}, () => {}).then(() => {
      const n = this.counts.get(key) - 1;
      if (n === 0) {
        this.counts.delete(key);
        this.tails.delete(key);
      } else {
        this.counts.set(key, n);
      }
    });
    this.tails.set(key, tail);
    return result;
  }

  /** pending is how many tasks of key are queued or running. */
  pending(key) {
    return this.counts.get(key) ?? 0;
  }

  /** idle resolves once nothing is queued under any key. */
  async idle() {
    while (this.tails.size > 0) {
      await Promise.all([...this.tails.values()]);
    }
  }
}

/** Mutex runs one task at a time, across keys. */
export class Mutex {
  constructor() {
    this.q = new SerialQueues();
  }

  run(fn) {
    return this.q.run('', fn);
  }
}
