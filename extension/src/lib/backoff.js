// Reconnect delays: exponential from minMs up to maxMs, with equal jitter
// (half of each delay fixed, half random), like the Go agent. The jitter
// spreads out extensions that lost the broker at the same moment; the fixed
// half keeps any one of them from retrying in a tight loop. The attempt
// count is plain data, so the service worker can store it and a restarted
// worker goes on where the last one stopped.

export class Backoff {
  constructor({ minMs = 1000, maxMs = 60000, random = Math.random, attempt = 0 } = {}) {
    if (!(minMs > 0) || !(maxMs >= minMs)) throw new Error('backoff: need 0 < minMs <= maxMs');
    this.minMs = minMs;
    this.maxMs = maxMs;
    this.random = random;
    this.attempt = attempt;
  }

  /** next returns the delay before the next attempt and counts it. */
  next() {
    const d = this.ceiling();
    this.attempt++;
    const half = d / 2;
    return Math.round(half + this.random() * half);
  }

  /** ceiling is the un-jittered delay of the next attempt. */
  ceiling() {
    // 2 ** 40 × minMs is far beyond any maxMs; stop doubling before floats
    // lose their way.
    return Math.min(this.maxMs, this.minMs * 2 ** Math.min(this.attempt, 40));
  }

  /** reset starts over from minMs, after a connection the broker accepted. */
  reset() {
    this.attempt = 0;
  }
}
