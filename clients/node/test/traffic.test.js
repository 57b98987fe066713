// The traffic reporter and the dependency budgets, against the real binary.
//
// The servers run the adaptive default (no --dependency-rate): each
// dependency's retries are a tenth of its successes a second, never fewer
// than one a second, so what the client reports by itself is what paces
// them. Each test starts a server of its own: a dependency's pace depends on
// every success it was ever told of, in a window of seconds.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, test } from 'node:test';

import { RetryBudgetClient, TrafficReporter } from '../retry_budget_client.js';
import { Advisor } from '../advisor.js';
import { startServer } from '../testing/server.js';

// The service's defaults ([dependencies] ratio and floor).
const RATIO = 0.1;
const FLOOR = 1;

let server;
const clients = [];

beforeEach(async () => {
  server = await startServer();
});

afterEach(async () => {
  await Promise.all(clients.splice(0).map((c) => c.close()));
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
});

const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;

/** A logger that keeps every line. */
function memoryLogger() {
  const lines = [];
  const keep = (line) => lines.push(line);
  return { lines, info: keep, warn: keep, error: keep };
}

function client(options = {}) {
  const c = new RetryBudgetClient(server.address, { tenant: fresh('node-traffic'), ...options });
  clients.push(c);
  return c;
}

/** Every tracked dependency's pace: ReportTraffic with an empty request. */
async function paces() {
  const rb = new RetryBudgetClient(server.address, { trafficIntervalMs: null });
  try {
    const r = await rb.reportTraffic({});
    return new Map(r.dependencies.map((p) => [p.dependency, p]));
  } finally {
    await rb.close();
  }
}

/** `paces()` once the service paces each of `names` by what it was told: it recomputes a pace at most once a second. */
async function paced(names, timeoutMs = 3000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const seen = await paces();
    if (names.every((n) => seen.get(n)?.success_rate > 0)) return seen;
    assert.ok(Date.now() < deadline, `not paced yet: ${[...seen.keys()]}`);
    await sleep(100);
  }
}

/** Until a report that named every one of `names` got its answer. */
async function sent(reporter, names, timeoutMs = 5000) {
  const deadline = Date.now() + timeoutMs;
  while (!names.every((n) => reporter.paces.has(n)) || Object.keys(reporter.pending()).length > 0) {
    assert.ok(Date.now() < deadline, `not sent: ${JSON.stringify(Object.keys(reporter.pending()))}`);
    await sleep(20);
  }
}

const counts = (p) => [p.calls, p.successes, p.failures];

test('the reporter sends counts by itself and the service paces each dependency by them', async () => {
  const rb = client({ trafficIntervalMs: 200 });
  const busy = fresh('busy');
  const quiet = fresh('quiet');
  for (let i = 0; i < 200; i++) await rb.traffic.call(busy, async () => 'ok');
  for (let i = 0; i < 10; i++) {
    await assert.rejects(rb.traffic.call(busy, async () => {
      throw Object.assign(new Error('refused'), { code: 'ECONNREFUSED' });
    }), /refused/);
  }
  const probe = rb.traffic.wrap(quiet, (ok) => {
    if (!ok) throw new Error('slow');
    return 'pong';
  });
  assert.equal(await probe(true), 'pong');
  await probe(true);
  await assert.rejects(probe(false), /slow/);
  rb.recordCall(quiet, false);
  // Nothing is sent by hand: the timer does it.
  await sent(rb.traffic, [busy, quiet]);
  assert.equal(rb.traffic.dropped, 0);

  const seen = await paced([busy, quiet]);
  const b = seen.get(busy);
  const q = seen.get(quiet);
  assert.deepEqual(counts(b), [210n, 200n, 10n]);
  assert.deepEqual(counts(q), [4n, 2n, 2n]);
  // 200 successes in one report, over a window of at most 5 s: at least 40
  // a second, so a tenth of them is past the floor.
  assert.ok(b.success_rate >= 40, `${b.success_rate}`);
  assert.equal(b.rule, 'ratio');
  assert.ok(Math.abs(b.allowed_rate - RATIO * b.success_rate) < 1e-6, `${b.allowed_rate} vs ${b.success_rate}`);
  assert.match(b.explanation, /retries\/s allowed \(10% of/);
  assert.equal(q.rule, 'floor');
  assert.equal(q.allowed_rate, FLOOR);
  assert.ok(RATIO * q.success_rate < FLOOR);
});

test('a failed send keeps its counts, never rejects, and goes out when the service answers', async () => {
  const logger = memoryLogger();
  const dependency = fresh('kept');
  // Nothing listens here: every report fails.
  const dead = new RetryBudgetClient('127.0.0.1:1', { trafficIntervalMs: 50, deadlineMs: 500, logger });
  dead.recordCall(dependency, true);
  dead.recordCall(dependency, true);
  dead.recordCall(dependency, false);
  await sleep(300); // several sends fail in the timer
  assert.deepEqual(dead.traffic.pending(), { [dependency]: { calls: 3n, successes: 2n, failures: 1n } });
  assert.equal(await dead.traffic.flush(), null, 'by hand too: no rejection');
  assert.equal(logger.lines.filter((l) => l.includes('cannot reach')).length, 1, logger.lines.join('\n'));
  // The kept batch, sent by a reporter whose client answers (as when the
  // service comes back): the same counts, once.
  dead.traffic.client = client({ trafficIntervalMs: null });
  assert.notEqual(await dead.traffic.flush(), null);
  assert.ok(logger.lines.some((l) => l.includes('again')), logger.lines.join('\n'));
  await dead.close();
  assert.deepEqual(counts((await paces()).get(dependency)), [3n, 2n, 1n]);
});

test('memory is bounded, bad names are refused where they are written, and null turns counting off', async () => {
  const rb = client({ trafficIntervalMs: 60_000, logger: memoryLogger() });
  rb.traffic.maxDependencies = 2;
  for (const name of ['a', 'b', 'c', 'd']) rb.recordCall(name, true);
  assert.deepEqual(Object.keys(rb.traffic.pending()), ['a', 'b']);
  assert.equal(rb.traffic.dropped, 2);
  for (const bad of ['has space', 'x'.repeat(65), 'café']) {
    assert.throws(() => rb.recordCall(bad, true), /printable ASCII/);
    assert.throws(() => new Advisor({ server: server.address, dependency: bad }, 'test'), /printable ASCII/);
  }
  const off = client({ trafficIntervalMs: null });
  off.recordCall('a', true);
  assert.deepEqual(off.traffic.pending(), {});
  assert.equal(off.traffic.enabled, false);
  assert.ok(rb.traffic instanceof TrafficReporter);
});

test('the dependency goes with NextAction and RecordSuccess', async () => {
  const rb = client({ trafficIntervalMs: null });
  const dependency = fresh('payments');
  const id = fresh('charge');
  const d = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', dependency });
  assert.equal(d.code, 'schedule_retry');
  assert.equal(d.dependency, dependency);
  assert.equal((await rb.getActivity({ activity_id: id })).events[0].dependency, dependency);
  // Every RecordSuccess counts one success of its dependency.
  await rb.recordSuccess({ activity_id: id, dependency });
  await rb.recordSuccess({ activity_id: fresh('never-failed'), dependency });
  const other = await rb.nextAction({ activity_id: fresh('charge'), attempt: 1, error_class: 'transient' });
  assert.equal(other.dependency, 'default');
  await assert.rejects(
    rb.nextAction({ activity_id: fresh('charge'), attempt: 1, error_class: 'transient', dependency: 'has space' }),
    (err) => err.grpcStatus === 'INVALID_ARGUMENT' && err.stableCode === 'invalid_dependency',
  );
  const p = (await paces()).get(dependency);
  assert.equal(p.successes, 2n);
  assert.equal(p.retries_admitted, 1n);
});

// -- two dependencies, one down ----------------------------------------------

const POLICY = { max_attempts: 100, deadline_seconds: 600, base: 0, cap: 0 };
// "up" starts cold, at the floor, and its first failures book slots ahead;
// its pace grows with its successes over the service's 5 s window, and the
// slots booked are paid off by 6 s. Reports four times a second keep the
// pace within a second of the calls (at the default 1 s the same loop pays
// them off about 3 s later).
const REPORT_EVERY_MS = 250;
const WARMUP_MS = 6000;
const MEASURE_MS = 4000;
const UP_EVERY_MS = 10; // "up" is called 100 times a second...
const UP_FAILS_ONE_IN = 20; // ...and fails one call in 20 (95% succeed)
const DOWN_ACTIVITIES = 3; // "down" always fails: three activities retry it

const until = (date) => sleep(Math.max(0, date.getTime() - Date.now()));

/**
 * A worker loop over "up" and "down" for WARMUP_MS + MEASURE_MS: each failed
 * call is reported (NextAction with its dependency), a retry runs at
 * not_before, a deferral is asked again at not_before; every call is counted
 * by the client's reporter, which sends the counts by itself. Resolves to
 * [{ at: ms since start, dependency, answer }].
 */
async function runTwoDependencies(rb) {
  const answers = [];
  const start = Date.now();
  const end = start + WARMUP_MS + MEASURE_MS;
  let upCalls = 0;
  const call = (dependency) => {
    if (dependency === 'down') return false;
    upCalls += 1;
    return upCalls % UP_FAILS_ONE_IN !== 0;
  };
  // One activity: calls until a call succeeds, or the loop's time is up.
  const activity = async (dependency) => {
    const id = fresh(dependency);
    for (let attempt = 1; Date.now() < end; attempt++) {
      if (call(dependency)) {
        if (attempt > 1) {
          // Close what was reported; the service counts the success.
          await rb.recordSuccess({ activity_id: id, dependency });
        }
        rb.recordCall(dependency, true, { successRecorded: attempt > 1 });
        return;
      }
      rb.recordCall(dependency, false);
      const occurredAt = new Date();
      for (;;) {
        const d = await rb.nextAction({
          activity_id: id, attempt, error_class: 'transient', policy: POLICY, occurred_at: occurredAt, dependency,
        });
        answers.push({ at: Date.now() - start, dependency, answer: d });
        if (d.code !== 'schedule_retry' && d.code !== 'deferred') throw new Error(`unexpected stop: ${d.code}`);
        await until(d.not_before);
        if (d.code === 'schedule_retry' || Date.now() >= end) break;
        // Deferred: the same attempt, asked again at not_before.
      }
    }
  };
  const running = [];
  for (let i = 0; i < DOWN_ACTIVITIES; i++) {
    running.push((async () => {
      while (Date.now() < end) await activity('down');
    })());
  }
  for (let next = start; Date.now() < end; next += UP_EVERY_MS) {
    running.push(activity('up'));
    await sleep(Math.max(0, next + UP_EVERY_MS - Date.now()));
  }
  await Promise.all(running);
  return answers;
}

test('a failing dependency is held to its floor and a healthy one is not', { timeout: 30_000 }, async () => {
  const rb = client({ trafficIntervalMs: REPORT_EVERY_MS });
  const answers = await runTwoDependencies(rb);
  const seen = await paces();
  const measured = answers.filter((a) => a.at >= WARMUP_MS);
  const up = measured.filter((a) => a.dependency === 'up').map((a) => a.answer);
  const down = measured.filter((a) => a.dependency === 'down').map((a) => a.answer);
  const summary = answers
    .map(({ at, dependency, answer: d }) => `${at} ${dependency} ${d.code} ${d.defer_reason} ${d.reason}`)
    .join('\n');

  // "up" succeeds 19 calls in 20: a tenth of its successes (9.5 a second)
  // covers its failures (5 a second), and none of its retries waits.
  assert.ok(up.length >= 10, summary);
  assert.deepEqual(up.filter((d) => d.code !== 'schedule_retry').map((d) => d.code), [], summary);
  assert.ok(up.every((d) => d.dependency === 'up'));
  const u = seen.get('up');
  assert.equal(u.rule, 'ratio');
  assert.ok(Math.abs(u.allowed_rate - RATIO * u.success_rate) < 1e-6);
  assert.ok(u.allowed_rate > 5, `${u.allowed_rate}`);

  // "down" has no success: its retries are held to the floor, one a second,
  // and each deferral says whose budget ran out, in numbers. Its activities
  // ask faster than the floor grants, so past the slots its bucket may book
  // some are told tenant_backlog_full: the backlog of the tenant within
  // "down"'s budget, with the same numbers.
  const deferred = down.filter((d) => d.code === 'deferred');
  const granted = down.filter((d) => d.code === 'schedule_retry');
  assert.ok(deferred.length > 0, summary);
  assert.ok(granted.length <= FLOOR * (MEASURE_MS / 1000) + 1, summary);
  assert.ok(deferred.some((d) => d.defer_reason === 'dependency_budget_exhausted'), summary);
  for (const d of deferred) {
    assert.equal(d.dependency, 'down');
    assert.ok(['dependency_budget_exhausted', 'tenant_backlog_full'].includes(d.defer_reason), d.reason);
    assert.ok(d.reason.includes(`${d.defer_reason}: down: 1 retries/s allowed (its floor`), d.reason);
  }
  const dn = seen.get('down');
  assert.equal(dn.rule, 'floor');
  assert.equal(dn.allowed_rate, FLOOR);
  assert.equal(dn.successes, 0n);
  assert.equal(dn.failures, dn.calls);
  assert.ok(dn.calls > 0n && dn.retries_deferred > 0n);
});
