// RetryBudgetBackoff with a real BullMQ Worker and Queue on the local Redis
// (127.0.0.1:6379, or RB_REDIS_URL), against the real server. Run by
// .ci/integrations_check.sh: `node --test integration_test/bullmq.js` (not
// named *.test.js, so the plain `node --test` of .ci/node_check.sh, which
// needs no Redis, leaves it out).

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import { Queue, QueueEvents, Worker } from 'bullmq';
import IORedis from 'ioredis';

import { RetryBudgetClient } from '../retry_budget_client.js';
import { BACKOFF_TYPE, RetryBudgetBackoff } from '../bullmq.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';

const REDIS_URL = process.env.RB_REDIS_URL ?? 'redis://127.0.0.1:6379';
const POLICY = { max_attempts: 5, deadline_seconds: 120, base: 0, cap: 0 };
const EARLY_MS = 50;
const LATE_MS = 1500;
const TENANT = `bullmq-${randomUUID().slice(0, 8)}`;

const servers = {};
const rigs = [];

/** A logger that keeps every line, to count the "cannot be reached" ones. */
function memoryLogger() {
  const lines = [];
  const keep = (line) => lines.push(line);
  return { lines, info: keep, warn: keep, error: keep };
}

/** A Queue, a Worker and their Redis connections for one server. */
async function rig(server, processorFn, { fallback = { type: 'fixed', delay: 300 }, wrap = true, dependency = 'smtp' } = {}) {
  const name = `rb-test-${randomUUID().slice(0, 8)}`;
  // BullMQ leaves connections it was given open: each is closed in after().
  const connections = [0, 1, 2].map(() => new IORedis(REDIS_URL, { maxRetriesPerRequest: null }));
  const logger = memoryLogger();
  const budget = new RetryBudgetBackoff({
    server: server.address, tenant: TENANT, dependency, policy: POLICY, deadlineMs: 1000, logger, fallback,
  });
  const queue = new Queue(name, { connection: connections[0] });
  const events = new QueueEvents(name, { connection: connections[1] });
  const worker = new Worker(name, wrap ? budget.processor(processorFn) : processorFn, {
    connection: connections[2],
    settings: { backoffStrategy: budget.backoffStrategy },
  });
  await Promise.all([queue.waitUntilReady(), events.waitUntilReady(), worker.waitUntilReady()]);
  const r = { name, queue, events, worker, budget, logger, connections };
  rigs.push(r);
  return r;
}

/** A job function that fails `failures` times, recording each start. */
function flaky(starts) {
  return async (job) => {
    const runs = (starts[job.data.key] ??= []);
    runs.push(Date.now());
    if (runs.length <= job.data.failures) {
      if (job.data.kind === 'permanent') throw new TypeError(`bad input (call ${runs.length})`);
      const err = new Error(`connection refused (call ${runs.length})`);
      err.code = 'ECONNREFUSED';
      throw err;
    }
    return `ok after ${runs.length}`;
  };
}

const add = (r, data) => r.queue.add('job', data, { attempts: 10, backoff: { type: BACKOFF_TYPE } });

async function activity(server, r, job) {
  const rb = new RetryBudgetClient(server.address, { tenant: TENANT });
  try {
    return await rb.getActivity({ activity_id: `${r.name}:${job.id}` });
  } finally {
    rb.close();
  }
}

/**
 * The (calls, successes, failures, retries admitted) the service counted for
 * `dependency` as TENANT's (ReportTraffic with an empty request, which
 * lists the calling tenant's dependencies only), once they are `expected`
 * or `timeoutMs` has passed: the strategy sends its counts about once a
 * second, in the background. A retry is admitted by the budget of the
 * dependency its NextAction named.
 */
async function traffic(server, dependency, expected, timeoutMs = 10_000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const rb = new RetryBudgetClient(server.address, { tenant: TENANT, trafficIntervalMs: null });
    const { dependencies } = await rb.reportTraffic({}).finally(() => rb.close());
    const p = dependencies.find((d) => d.dependency === dependency);
    const seen = p ? [p.calls, p.successes, p.failures, p.retries_admitted].map(Number) : null;
    if (JSON.stringify(seen) === JSON.stringify(expected) || Date.now() > deadline) return seen;
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

// Every server runs a static dependency rate at the global one: these tests
// are about how BullMQ schedules what the service plans, with retries back
// to back in one dependency, which the adaptive default would pace by what
// it sees of the dependency (test/traffic.test.js runs that default).
before(async () => {
  servers.plain = await startServer(GLOBAL_BUDGET_ONLY);
  servers.tight = await startServer([...GLOBAL_BUDGET_ONLY, '--retry-rate', '1', '--retry-burst', '1']);
});

after(async () => {
  for (const r of rigs) {
    await r.worker.close();
    await r.events.close();
    await r.queue.obliterate({ force: true }).catch(() => {});
    await r.queue.close();
    await r.budget.close();
    for (const c of r.connections) c.disconnect();
  }
  for (const s of Object.values(servers)) await s.stop();
});

test('two transient failures then success: three runs, each retry at the service\'s not_before', async () => {
  const starts = {};
  const r = await rig(servers.plain, flaky(starts));
  const job = await add(r, { key: 'ok', failures: 2 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 3');
  const act = await activity(servers.plain, r, job);
  const decisions = act.events.filter((e) => e.kind === 'decision');
  assert.deepEqual(decisions.map((e) => [e.attempt, e.code]), [[1, 'schedule_retry'], [2, 'schedule_retry']]);
  assert.equal(act.closed_code, 'succeeded');
  assert.equal(starts.ok.length, 3);
  decisions.forEach((e, i) => {
    const nb = e.not_before.getTime();
    const start = starts.ok[i + 1];
    assert.ok(start >= nb - EARLY_MS && start <= nb + LATE_MS, `run ${i + 2} at ${start}, not_before ${nb}`);
  });
  assert.ok(r.logger.lines.some((l) => l.includes(`activity=${r.name}:${job.id} attempt=1 dependency=smtp code=schedule_retry`)),
    r.logger.lines.join('\n'));
});

test('each run is counted for its dependency and sent by itself', async () => {
  const starts = {};
  const dependency = `smtp-${randomUUID().slice(0, 8)}`;
  const r = await rig(servers.plain, flaky(starts), { dependency });
  const job = await add(r, { key: 'counted', failures: 2 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 3');
  // Three runs, two failed; the success counted by the RecordSuccess that
  // named the dependency, once; both retries taken from its budget.
  assert.deepEqual(await traffic(servers.plain, dependency, [3, 1, 2, 2]), [3, 1, 2, 2]);
});

test('the strategy alone, without processor(): it asks NextAction itself and BullMQ waits the planned delay', async () => {
  const starts = {};
  const r = await rig(servers.plain, flaky(starts), { wrap: false });
  const job = await add(r, { key: 'alone', failures: 1 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 2');
  const act = await activity(servers.plain, r, job);
  assert.deepEqual(act.events.map((e) => [e.kind, e.attempt, e.code]), [['decision', 1, 'schedule_retry']]);
  const nb = act.events[0].not_before.getTime();
  assert.ok(starts.alone[1] >= nb - EARLY_MS && starts.alone[1] <= nb + LATE_MS, `${starts.alone[1]} vs ${nb}`);
});

test('a classifier that throws is the integration\'s fault: BullMQ\'s own backoff, and the job completes', async () => {
  const starts = {};
  const r = await rig(servers.plain, flaky(starts));
  r.budget.advisor.settings.classify = () => { throw new Error('classifier bug'); };
  const job = await add(r, { key: 'bug', failures: 1 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 2');
  assert.ok(r.logger.lines.some((l) => l.includes('retry-budget integration failed') && l.includes('classifier bug')),
    r.logger.lines.join('\n'));
});

test('a permanent failure becomes UnrecoverableError: one run, no retry', async () => {
  const starts = {};
  const r = await rig(servers.plain, flaky(starts));
  const job = await add(r, { key: 'perm', failures: 5, kind: 'permanent' });
  await assert.rejects(job.waitUntilFinished(r.events, 30_000), /retry-budget: fail_permanent/);
  const failed = await r.queue.getJob(job.id);
  assert.equal(failed.attemptsMade, 1);
  assert.equal(starts.perm.length, 1);
  assert.equal((await activity(servers.plain, r, job)).closed_code, 'fail_permanent');
});

test('with the global budget exhausted the job waits for the booked slot', async () => {
  const rb = new RetryBudgetClient(servers.tight.address, { tenant: TENANT });
  await rb.nextAction({ activity_id: `drain-${randomUUID()}`, attempt: 1, error_class: 'transient', occurred_at: new Date() });
  rb.close();
  const starts = {};
  const r = await rig(servers.tight, flaky(starts));
  const job = await add(r, { key: 'defer', failures: 1 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 2');
  const act = await activity(servers.tight, r, job);
  assert.deepEqual(act.events.slice(0, 2).map((e) => [e.kind, e.attempt, e.code]),
    [['decision', 1, 'deferred'], ['decision', 1, 'schedule_retry']]);
  assert.ok(act.events[0].slot_booked && act.events[1].token_taken);
  const slot = act.events[0].not_before.getTime();
  assert.ok(starts.defer[1] >= slot - EARLY_MS && starts.defer[1] <= slot + LATE_MS, `${starts.defer[1]} vs slot ${slot}`);
  assert.equal(act.closed_code, 'succeeded');
});

test('the service stopped mid-run: BullMQ\'s own backoff, said once, and the job completes', async () => {
  const server = await startServer(GLOBAL_BUDGET_ONLY);
  servers.doomed = server;
  const starts = {};
  let stopped;
  const r = await rig(server, async (job) => {
    const runs = (starts[job.data.key] ??= []);
    if (runs.length === 1) stopped ??= server.stop(); // the second run finds no service
    await stopped;
    return flaky({ [job.data.key]: runs })(job);
  });
  const job = await add(r, { key: 'down', failures: 3 });
  assert.equal(await job.waitUntilFinished(r.events, 30_000), 'ok after 4');
  const down = r.logger.lines.filter((l) => l.includes('cannot be reached'));
  assert.equal(down.length, 1, r.logger.lines.join('\n'));
  assert.match(down[0], /BullMQ's own retry settings/);
  // Runs 3 and 4 came on BullMQ's fixed 300 ms backoff.
  const gaps = starts.down.slice(2).map((t, i) => t - starts.down[i + 1]);
  assert.ok(gaps.every((g) => g >= 300 - EARLY_MS && g < 300 + LATE_MS), String(gaps));
});
