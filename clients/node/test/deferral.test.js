// ACTION_DEFERRED under a tiny global retry budget (--retry-rate 1
// --retry-burst 1: one token, one more a second). Each test gets its own
// server, so each starts with exactly one token in the bucket.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, test } from 'node:test';

import { RetryBudgetClient } from '../retry_budget_client.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';
import { FlakyDependency, runActivity } from '../worker_example.js';

let server;
let rb;

beforeEach(async () => {
  server = await startServer([...GLOBAL_BUDGET_ONLY, '--retry-rate', '1', '--retry-burst', '1']);
  rb = new RetryBudgetClient(server.address, { tenant: 'node-deferral' });
});

afterEach(async () => {
  rb?.close();
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
});

const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;
const report = (id, attempt) => rb.nextAction({ activity_id: id, attempt, error_class: 'transient', occurred_at: new Date() });

// Takes the bucket's one token with a retry of another activity.
async function drain() {
  const d = await report(fresh('drain'), 1);
  assert.equal(d.code, 'schedule_retry', 'the first retry takes the only token');
}

test('with no token left a retry is deferred, consumes no attempt, and is granted at not_before', async () => {
  await drain();
  const id = fresh('deferred');
  const d = await report(id, 1);
  assert.equal(d.action, 'ACTION_DEFERRED');
  assert.equal(d.code, 'deferred');
  assert.equal(d.defer_reason, 'global_capacity_exhausted');
  assert.equal(d.attempt, 1);
  assert.equal(d.slot_booked, true, 'a slot is booked for it');
  assert.equal(d.token_taken, false, 'a booking is not a token: do not run yet');
  assert.ok(d.not_before instanceof Date);
  assert.ok(d.not_before.getTime() > Date.now(), 'not_before is ahead');
  assert.ok(d.not_before.getTime() < Date.now() + 3000, 'within the booking horizon');

  const act = await rb.getActivity({ activity_id: id });
  assert.equal(act.attempts, 0, 'a deferral consumes no attempt');
  assert.deepEqual(act.reservation_not_before, d.not_before);

  // Asked again too early: the same deferral, the bucket untouched.
  const early = await report(id, 1);
  assert.equal(early.code, 'deferred');
  assert.deepEqual(early.not_before, d.not_before);
  assert.equal(early.replayed, true);
  assert.equal(early.token_taken, false);

  // Asked at not_before: the booked slot pays for the retry.
  await sleep(d.not_before.getTime() - Date.now() + 10);
  const granted = await report(id, 1);
  assert.equal(granted.code, 'schedule_retry');
  assert.equal(granted.token_taken, true);
  assert.equal((await rb.getActivity({ activity_id: id })).attempts, 1);
});

test('the worker loop waits out a deferral and then runs to success', async () => {
  await drain();
  const id = fresh('worker');
  const dependency = new FlakyDependency(1);
  const lines = [];
  const code = await runActivity(rb, id, dependency, { max_attempts: 3, deadline_seconds: 60, base: 0, cap: 0 }, (l) => lines.push(l));
  assert.equal(code, 'succeeded', lines.join('\n'));
  assert.equal(dependency.calls, 2);
  assert.ok(lines.some((l) => l.includes('deferred: global_capacity_exhausted')), lines.join('\n'));
  const act = await rb.getActivity({ activity_id: id });
  assert.deepEqual(act.events.map((e) => [e.kind, e.attempt, e.code]), [
    ['decision', 1, 'deferred'],
    ['decision', 1, 'schedule_retry'],
    ['success', 2, 'succeeded'],
  ]);
});

test('a worker restarted while deferred reports the same attempt again instead of running it twice', async () => {
  await drain();
  const id = fresh('restart');
  const policy = { max_attempts: 3, deadline_seconds: 60, base: 0, cap: 0 };
  // The worker that crashed: attempt 1 failed and was deferred.
  const first = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy, occurred_at: new Date() });
  assert.equal(first.code, 'deferred');

  const dependency = new FlakyDependency(0);
  const lines = [];
  const code = await runActivity(rb, id, dependency, policy, (l) => lines.push(l));
  assert.equal(code, 'succeeded', lines.join('\n'));
  assert.equal(dependency.calls, 1, 'only attempt 2 ran in the restarted worker');
  const act = await rb.getActivity({ activity_id: id });
  assert.deepEqual(act.events.map((e) => [e.attempt, e.code]), [
    [1, 'deferred'],
    [1, 'schedule_retry'],
    [2, 'succeeded'],
  ]);
});
