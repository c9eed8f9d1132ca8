import assert from 'node:assert/strict';
import { test } from 'node:test';

import { Holds, holdBadge, holdLabel, pageAction } from '../src/lib/holds.js';

test('a hold goes asked, pending, active, ended', () => {
  const h = new Holds();
  assert.deepEqual(h.take(7, 5, 0), { type: 'hold', context_id: 'tab-7', ttl_s: 300 });
  assert.equal(h.get(7).state, 'asked');
  assert.equal(h.apply({ type: 'hold_state', context_id: 'tab-7', state: 'pending' }), 7);
  assert.equal(h.get(7).state, 'pending');
  assert.equal(holdBadge(h.get(7)).text, 'YOU');
  assert.match(holdBadge(h.get(7)).title, /taking control/);
  h.apply({ type: 'hold_state', context_id: 'tab-7', state: 'active' });
  assert.match(holdBadge(h.get(7)).title, /you drive this tab/);
  assert.equal(holdLabel(h.get(7), 60000), 'you drive it (4 min left)');
  assert.deepEqual(h.give(7), { type: 'unhold', context_id: 'tab-7' });
  assert.equal(h.apply({ type: 'hold_state', context_id: 'tab-7', state: 'ended' }), 7);
  assert.equal(h.get(7), null);
  assert.equal(h.apply({ type: 'hold_state', context_id: 'tab-7', state: 'ended' }), null, 'ended twice: nothing to redraw');
});

test('the timer is clamped, and a second take keeps the state', () => {
  const h = new Holds();
  assert.equal(h.take(1, 0).ttl_s, 300, 'no minutes: the default');
  assert.equal(h.take(1, 500).ttl_s, 3600);
  h.apply({ type: 'hold_state', context_id: 'tab-1', state: 'active' });
  h.take(1, 2);
  assert.equal(h.get(1).state, 'active');
  assert.deepEqual(h.clear(), [1]);
});

test('the page action offers Take control on a worker tab, Give back on a held one, nothing elsewhere', () => {
  assert.deepEqual(pageAction({ worker: false, held: null, connected: true }).visible, false);
  assert.equal(pageAction({ worker: false, held: null, connected: true }).action, null);
  const take = pageAction({ worker: true, held: null, connected: true });
  assert.equal(take.visible, true);
  assert.equal(take.enabled, true);
  assert.equal(take.action, 'hold');
  assert.match(take.title, /take control/);
  const away = pageAction({ worker: true, held: null, connected: false });
  assert.equal(away.enabled, false, 'a hold is the broker\'s: nothing to take while it is away');
  assert.equal(away.action, null);
  const give = pageAction({ worker: true, held: { state: 'pending' }, connected: false });
  assert.equal(give.action, 'unhold', 'a give-back is never out of reach');
  assert.equal(give.enabled, true);
  assert.match(give.title, /give this tab back/);
});
