// worker_example.js against the real binary: run as a program to success,
// stopped by a terminal action, and restarted in the middle of an activity.

import assert from 'node:assert/strict';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { after, before, test } from 'node:test';

import { RetryBudgetClient } from '../retry_budget_client.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';
import { FlakyDependency, runActivity } from '../worker_example.js';

const EXAMPLE = path.join(path.dirname(fileURLToPath(import.meta.url)), '..', 'worker_example.js');
const run = promisify(execFile);

let server;
let rb;

before(async () => {
  server = await startServer(GLOBAL_BUDGET_ONLY);
  rb = new RetryBudgetClient(server.address, { tenant: 'node-worker' });
});

after(async () => {
  rb?.close();
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
});

const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;
const FAST = { max_attempts: 3, deadline_seconds: 60, base: 0, cap: 0 };

test('node worker_example.js --server runs an activity with two failures to success', async () => {
  const id = fresh('example');
  const started = Date.now();
  const { stdout } = await run(process.execPath, [EXAMPLE, '--server', server.address, '--activity-id', id, '--failures', '2'], {
    timeout: 60_000,
  });
  assert.match(stdout, /done: succeeded after 3 call\(s\) to the dependency/);
  assert.match(stdout, /sleeping [\d.]+ s until not_before/);
  assert.ok(Date.now() - started < 30_000);

  // The example uses the default tenant (no --tenant).
  const viewer = new RetryBudgetClient(server.address);
  try {
    const act = await viewer.getActivity({ activity_id: id });
    assert.equal(act.attempts, 2);
    assert.equal(act.closed_code, 'succeeded');
    assert.deepEqual(act.events.map((e) => e.kind), ['decision', 'decision', 'success']);
  } finally {
    viewer.close();
  }
});

test('the example exits 1 on a terminal action and 2 on a service error', async () => {
  await assert.rejects(
    run(process.execPath, [EXAMPLE, '--server', server.address, '--activity-id', fresh('perm'), '--error', 'permanent'], { timeout: 60_000 }),
    (err) => err.code === 1 && /stopping: fail_permanent/.test(err.stdout),
  );
  await assert.rejects(
    run(process.execPath, [EXAMPLE, '--server', server.address, '--activity-id', 'bad\nid'], { timeout: 60_000 }),
    (err) => err.code === 2 && /INVALID_ARGUMENT .*\(code activity_id_control_character\)/.test(err.stderr),
  );
});

test('the loop stops on attempts_exhausted, and a restarted worker does not reset the budget', async () => {
  const id = fresh('exhausted');
  const dependency = new FlakyDependency(100);
  const lines = [];
  const code = await runActivity(rb, id, dependency, { ...FAST, max_attempts: 2 }, (l) => lines.push(l));
  assert.equal(code, 'attempts_exhausted', lines.join('\n'));
  assert.equal(dependency.calls, 2);

  const again = new FlakyDependency(0);
  assert.equal(await runActivity(rb, id, again, {}, () => {}), 'attempts_exhausted');
  assert.equal(again.calls, 0, 'a closed activity is not run again');
});

test('a worker restarted mid-activity continues from the recorded attempt', async () => {
  const id = fresh('resume');
  // The worker that crashed: attempt 1 failed and was planned.
  const first = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: FAST, occurred_at: new Date() });
  assert.equal(first.code, 'schedule_retry');

  const dependency = new FlakyDependency(1); // attempt 2 fails too, attempt 3 succeeds
  const lines = [];
  const code = await runActivity(rb, id, dependency, FAST, (l) => lines.push(l));
  assert.equal(code, 'succeeded', lines.join('\n'));
  assert.ok(lines.includes(`resuming activity ${id} at attempt 2`), lines.join('\n'));
  const act = await rb.getActivity({ activity_id: id });
  assert.equal(act.attempts, 2);
  assert.deepEqual(act.events.map((e) => [e.attempt, e.code]), [
    [1, 'schedule_retry'],
    [2, 'schedule_retry'],
    [3, 'succeeded'],
  ]);
});
