// The traffic reporter and the dependency budgets, against the real binary.
//
// The servers run the adaptive default (no --dependency-rate): each
// dependency's shared allowance is set by what the service sees of it (20
// retries a second before it has seen anything, cut by half a second while
// the retries it grants fail, never below a floor of one a second, grown
// back while they do not), and the successes the client reports by itself
// earn its tenant a tenth of them a second as retries of its own, on top.
// A listing (ReportTraffic with an empty request) shows the calling
// tenant's dependencies only, so each test reads it as the tenant that
// reported. Each test starts a server of its own: a dependency's pace
// depends on what it saw in a window of seconds.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { afterEach, beforeEach, test } from 'node:test';

import { RetryBudgetClient, TrafficReporter } from '../retry_budget_client.js';
import { Advisor } from '../advisor.js';
import { startServer } from '../testing/server.js';

// The service's defaults ([dependencies] ratio, floor and initial).
const RATIO = 0.1;
const FLOOR = 1;
const INITIAL = 20;

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

/**
 * The pace of every dependency `tenant` used (the default tenant when
 * absent), as that tenant sees it: ReportTraffic with an empty request.
 */
async function paces(tenant) {
  const rb = new RetryBudgetClient(server.address, { tenant, trafficIntervalMs: null });
  try {
    const r = await rb.reportTraffic({});
    return new Map(r.dependencies.map((p) => [p.dependency, p]));
  } finally {
    await rb.close();
  }
}

/** `paces(tenant)` once the service counts the successes `tenant` reported of each of `names`: it recomputes a pace at most once a second. */
async function paced(tenant, names, timeoutMs = 3000) {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const seen = await paces(tenant);
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

  const seen = await paced(rb.tenant, [busy, quiet]);
  // The counts are the reporting tenant's own: another tenant's listing
  // (here the default tenant's) shows neither dependency.
  assert.deepEqual([...(await paces()).keys()], []);
  const b = seen.get(busy);
  const q = seen.get(quiet);
  assert.deepEqual(counts(b), [210n, 200n, 10n]);
  assert.deepEqual(counts(q), [4n, 2n, 2n]);
  // 200 successes in one report, over a window of at most 5 s: at least 40
  // a second. They earn the tenant a lane of its own, a tenth of them.
  assert.ok(b.success_rate >= 40, `${b.success_rate}`);
  assert.equal(b.ratio, RATIO);
  assert.ok(Math.abs(b.earned_rate - RATIO * b.success_rate) < 1e-6, `${b.earned_rate} vs ${b.success_rate}`);
  assert.ok(Math.abs(q.earned_rate - RATIO * q.success_rate) < 1e-6, `${q.earned_rate} vs ${q.success_rate}`);
  assert.ok(q.earned_rate < b.earned_rate, `${q.earned_rate} vs ${b.earned_rate}`);
  // Reported successes are evidence of health, and never raise the shared
  // allowance: it was asked about no failure of either, so both start at
  // the starting allowance and rest at what the tenant's own lane leaves
  // of it, however many successes each reported.
  for (const p of [b, q]) {
    assert.equal(p.state, 'healthy', p.explanation);
    assert.equal(p.rule, p.state, 'rule says the same as state, for clients of 0.1');
    const rest = Math.max(FLOOR, INITIAL - p.earned_rate);
    assert.ok(p.allowed_rate >= rest - 1e-6 && p.allowed_rate <= INITIAL + 1e-6, p.explanation);
  }
  assert.match(b.explanation,
    /^[\d.]+ retries\/s allowed: healthy: no retry granted in the last 10 s to fail; [\d.]+ more for this tenant \(10% of its [\d.]+ successes\/s\)$/);
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
  // service comes back): the same counts, once, counted for that client's
  // tenant.
  const alive = client({ trafficIntervalMs: null });
  dead.traffic.client = alive;
  assert.notEqual(await dead.traffic.flush(), null);
  assert.ok(logger.lines.some((l) => l.includes('again')), logger.lines.join('\n'));
  await dead.close();
  assert.deepEqual(counts((await paces(alive.tenant)).get(dependency)), [3n, 2n, 1n]);
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
  const p = (await paces(rb.tenant)).get(dependency);
  assert.equal(p.successes, 2n);
  assert.equal(p.retries_admitted, 1n);
});

// -- two dependencies, one down ----------------------------------------------

const POLICY = { max_attempts: 100, deadline_seconds: 600, base: 0, cap: 0 };
// Both start at the starting allowance (20 retries a second). "up" fails
// 5 calls a second and its granted retries succeed: it is never cut, so
// none of its retries waits, from the first second. "down" fails every
// call: its granted retries fail, which cuts its allowance to the floor of 1
// at once (trouble out of calm), and each further second of it by half,
// the probes spaced out to one every 8 s, within WARMUP_MS; then it is
// measured. Reports four times a second keep "up"'s earned lane
// within a second of its calls.
const REPORT_EVERY_MS = 250;
const WARMUP_MS = 6000;
const MEASURE_MS = 4000;
const UP_EVERY_MS = 10; // "up" is called 100 times a second...
const UP_FAILS_ONE_IN = 20; // ...and fails one call in 20 (95% succeed)
const DOWN_ACTIVITIES = 3; // "down" always fails: three activities retry it
// The longest a deferral may put off the next question ([bucket]
// max_deferral).
const MAX_DEFERRAL_MS = 10_000;

const until = (date) => sleep(Math.max(0, date.getTime() - Date.now()));

/**
 * A worker loop over "up" and "down" for WARMUP_MS + MEASURE_MS: each failed
 * call is reported (NextAction with its dependency), a retry runs at
 * not_before, a deferral is asked again at not_before; every call is counted
 * by the client's reporter, which sends the counts by itself. Resolves to
 * [{ at: ms since start, received: epoch ms, dependency, answer }].
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
        const received = Date.now();
        answers.push({ at: received - start, received, dependency, answer: d });
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

test('a failing dependency is cut to its floor and a healthy one is not', { timeout: 30_000 }, async () => {
  const rb = client({ trafficIntervalMs: REPORT_EVERY_MS });
  // The paces as the loop's time ends: after it the loop only waits out its
  // last retries and deferrals, and "down", asked about nothing, would
  // start to grow back.
  const [answers, seen] = await Promise.all([
    runTwoDependencies(rb),
    sleep(WARMUP_MS + MEASURE_MS).then(() => paces(rb.tenant)),
  ]);
  const summary = answers
    .map(({ at, dependency, answer: d }) => `${at} ${dependency} ${d.code} ${d.defer_reason} ${d.reason}`)
    .join('\n');
  const pace = (p) => JSON.stringify(p, (k, v) => (typeof v === 'bigint' ? Number(v) : v));

  // "up" succeeds 19 calls in 20 and its granted retries succeed: it is
  // never cut, and none of its retries waits, from the first second on (it
  // starts at 20 retries a second; it fails 5 a second).
  const up = answers.filter((a) => a.dependency === 'up').map((a) => a.answer);
  assert.ok(up.length >= 25, summary);
  assert.deepEqual(up.filter((d) => d.code !== 'schedule_retry').map((d) => d.code), [], summary);
  assert.ok(up.every((d) => d.dependency === 'up'));
  const u = seen.get('up');
  assert.equal(u.state, 'healthy', pace(u));
  assert.equal(u.rule, u.state);
  // Neither cut nor grown (it was never deferred): the starting allowance,
  // or on its way down to what the tenant's own lane leaves of it (its
  // resting allowance), within the 1 a second the rest moves by with the
  // lane before the next step follows it.
  const rest = Math.max(FLOOR, INITIAL - u.earned_rate);
  assert.ok(u.allowed_rate >= rest - 1 && u.allowed_rate <= INITIAL + 1e-6, pace(u));
  assert.ok(u.window_retries_granted > 0 && 2 * u.window_retries_failed < u.window_retries_granted, pace(u));
  assert.equal(u.retries_deferred, 0n, pace(u));
  // Its reported successes (about 95 a second) earn the tenant a tenth of
  // them on top, a lane of its own; they do not raise the shared allowance.
  assert.ok(u.success_rate > 50, pace(u));
  assert.ok(Math.abs(u.earned_rate - RATIO * u.success_rate) < 1e-6, pace(u));
  assert.match(u.explanation, /retries granted in the last 10 s failed; [\d.]+ more for this tenant \(10% of its/);

  // "down" has no success and every retry it is granted fails: it is cut
  // to its floor and below it (its probes spaced out) once warmed up, and each deferral says
  // whose budget ran out, in numbers. A durable deferral holds its place in
  // line (waiting_since), and is never put off past the longest deferral.
  const down = answers.filter((a) => a.dependency === 'down');
  const measured = down.filter((a) => a.at >= WARMUP_MS).map((a) => a.answer);
  const deferred = measured.filter((d) => d.code === 'deferred');
  const granted = measured.filter((d) => d.code === 'schedule_retry');
  assert.ok(deferred.length > 0, summary);
  // One a second at most (the floor), a token of burst, and a second's margin.
  assert.ok(granted.length <= FLOOR * (MEASURE_MS / 1000) + 2, summary);
  for (const d of deferred) {
    assert.equal(d.dependency, 'down');
    assert.equal(d.defer_reason, 'dependency_budget_exhausted', d.reason);
    assert.match(d.reason, /dependency_budget_exhausted: down: [\d.]+ retries\/s allowed: \d+ of the \d+ retries granted in the last 10 s failed, none free/);
  }
  for (const { received, answer: d } of down.filter((a) => a.answer.code === 'deferred')) {
    assert.ok(d.waiting_since instanceof Date && d.waiting_since.getTime() <= received, `${d.waiting_since}`);
    assert.ok(d.not_before.getTime() - received <= MAX_DEFERRAL_MS, `${d.not_before.toISOString()} asked at ${received}`);
  }
  const dn = seen.get('down');
  assert.equal(dn.state, 'trouble', pace(dn));
  assert.equal(dn.rule, dn.state);
  // Near its floor: below it while its spaced-out probes fail, or a step or
  // two of growth above it between two of them (the hold is over, and the
  // few calls of three activities do not hold growth back).
  assert.ok(dn.allowed_rate >= FLOOR / 8 && dn.allowed_rate <= 2.5, pace(dn));
  assert.ok(dn.window_retries_failed >= 3 && 2 * dn.window_retries_failed >= dn.window_retries_granted, pace(dn));
  assert.match(dn.explanation, /^[\d.]+ retries\/s allowed: \d+ of the \d+ retries granted in the last 10 s failed$/);
  assert.equal(dn.earned_rate, 0);
  assert.equal(dn.successes, 0n);
  assert.equal(dn.failures, dn.calls);
  assert.ok(dn.calls > 0n && dn.retries_deferred > 0n);
});
