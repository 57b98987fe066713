// The durable form end to end against the real binary: the service owns each
// activity's budget, counts attempts, replays decisions, and keeps history.

import assert from 'node:assert/strict';
import { randomUUID } from 'node:crypto';
import { after, before, test } from 'node:test';

import { RetryBudgetClient, errorInfo, grpc, toTimestamp } from '../retry_budget_client.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';

let server;
let rb;
const tenant = `node-${randomUUID().slice(0, 8)}`;

before(async () => {
  server = await startServer(GLOBAL_BUDGET_ONLY);
  rb = new RetryBudgetClient(server.address, { tenant });
});

after(async () => {
  rb?.close();
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
});

const fresh = (prefix) => `${prefix}-${randomUUID().slice(0, 8)}`;
// A minute ago, at .250 s: the server refuses times far from its clock.
const T0 = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000 + 250);
const at = (seconds) => new Date(T0.getTime() + seconds * 1000);
const POLICY = { max_attempts: 3, deadline_seconds: 3600 };

test('a first failure gets a retry plan: the reference delay from occurred_at', async () => {
  const id = fresh('plan');
  const d = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: POLICY, occurred_at: T0, workflow_id: 'wf-1' });
  assert.equal(d.action, 'ACTION_SCHEDULE_RETRY');
  assert.equal(d.code, 'schedule_retry');
  assert.equal(d.attempt, 1);
  assert.equal(d.replayed, false);
  assert.equal(d.token_taken, true);
  assert.equal(d.policy_conflict, false);
  assert.deepEqual(d.policy, { max_attempts: 3, deadline_seconds: 3600n });
  const expected = await rb.retryDelay({ activity_id: id, attempt: 1 }); // default base 2, cap 60
  assert.equal(d.delay_seconds, expected.delay_seconds);
  assert.equal(d.delay_ms, expected.delay_ms);
  assert.ok(d.not_before instanceof Date);
  assert.equal(d.not_before.getTime(), T0.getTime() + Number(d.delay_ms));
});

test('the same attempt again is replayed: replayed true, the same plan, nothing counted', async () => {
  const id = fresh('replay');
  const first = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: POLICY, occurred_at: T0 });
  // Another occurred_at and another policy: the recorded decision stands.
  const again = await rb.nextAction({
    activity_id: id,
    attempt: 1,
    error_class: 'transient',
    policy: { max_attempts: 9, deadline_seconds: 60 },
    occurred_at: at(99),
  });
  assert.equal(first.replayed, false);
  assert.equal(again.replayed, true);
  assert.equal(again.code, first.code);
  assert.equal(again.delay_ms, first.delay_ms);
  assert.deepEqual(again.not_before, first.not_before);
  assert.deepEqual(again.policy, first.policy);
  const act = await rb.getActivity({ activity_id: id });
  assert.equal(act.attempts, 1);
  assert.equal(act.events.length, 1);
});

test('attempts are counted by the service, and the last one allowed stops with attempts_exhausted', async () => {
  const id = fresh('count');
  const codes = [];
  for (let attempt = 1; attempt <= 3; attempt++) {
    const d = await rb.nextAction({ activity_id: id, attempt, error_class: 'transient', policy: POLICY, occurred_at: at(attempt * 10) });
    assert.equal(d.attempt, attempt);
    codes.push(d.code);
  }
  assert.deepEqual(codes, ['schedule_retry', 'schedule_retry', 'attempts_exhausted']);
  const act = await rb.getActivity({ activity_id: id });
  assert.equal(act.attempts, 3);
  assert.equal(act.status, 'ACTIVITY_STATUS_CLOSED');
  assert.equal(act.closed_code, 'attempts_exhausted');
  assert.ok(act.closed_at instanceof Date);
  assert.deepEqual(act.events.map((e) => [e.attempt, e.code]), [[1, 'schedule_retry'], [2, 'schedule_retry'], [3, 'attempts_exhausted']]);
  assert.deepEqual(act.events.map((e) => e.elapsed_seconds), [0n, 10n, 20n]);
});

test('skipping an attempt is FAILED_PRECONDITION attempt_out_of_order', async () => {
  const id = fresh('order');
  await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: POLICY, occurred_at: T0 });
  await assert.rejects(rb.nextAction({ activity_id: id, attempt: 3, error_class: 'transient', occurred_at: at(10) }), (err) => {
    assert.equal(err.code, grpc.status.FAILED_PRECONDITION);
    assert.equal(err.grpcStatus, 'FAILED_PRECONDITION');
    assert.equal(err.stableCode, 'attempt_out_of_order');
    assert.match(err.details, /^attempt_out_of_order: /);
    // The values involved, from google.rpc.ErrorInfo: no parsing of the text.
    assert.equal(err.errorInfo.reason, 'attempt_out_of_order');
    assert.equal(err.errorInfo.domain, 'retrybudget.v1');
    assert.deepEqual(err.errorInfo.metadata, { field: 'attempt', expected: '2', got: '3' });
    return true;
  });
  // Nothing was recorded for the refused report.
  assert.equal((await rb.getActivity({ activity_id: id })).attempts, 1);
});

test('Timestamps round-trip through GetActivity as Dates', async () => {
  const id = fresh('time');
  const occurred = new Date(T0.getTime() + 539);
  const d = await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: POLICY, occurred_at: occurred });
  const act = await rb.getActivity({ activity_id: id });
  assert.deepEqual(act.started_at, occurred);
  assert.deepEqual(act.events[0].occurred_at, occurred);
  assert.equal(act.events[0].occurred_at_stamped, false);
  assert.deepEqual(act.events[0].not_before, d.not_before);
  assert.ok(act.events[0].recorded_at instanceof Date);
  assert.equal(act.closed_at, null); // absent Timestamps are null
  assert.equal(act.reservation_not_before, null);

  // {seconds, nanos} is sent as given; the Date that comes back drops what
  // is below the millisecond.
  const nanosId = fresh('nanos');
  const seconds = Math.floor(T0.getTime() / 1000);
  await rb.nextAction({ activity_id: nanosId, attempt: 1, error_class: 'permanent', occurred_at: { seconds, nanos: 789_123_456 } });
  assert.equal((await rb.getActivity({ activity_id: nanosId })).started_at.getTime(), seconds * 1000 + 789);
});

test('a Date given to the raw stub is sent as 1970, and refused: why toTimestamp exists', async () => {
  const id = fresh('trap');
  const metadata = new grpc.Metadata();
  metadata.set('x-tenant-id', tenant);
  const request = { activity_id: id, attempt: 1, error_class: 'ERROR_CLASS_TRANSIENT', occurred_at: new Date() };
  const err = await new Promise((resolve) => rb.stub.NextAction(request, metadata, (e) => resolve(e)));
  // proto-loader found no seconds or nanos on the Date: an all-zero
  // Timestamp, 1970, which the server refuses rather than plan in 1970.
  assert.equal(err?.code, grpc.status.INVALID_ARGUMENT);
  const info = errorInfo(err.metadata);
  assert.equal(info.reason, 'timestamp_implausible');
  assert.equal(info.domain, 'retrybudget.v1');
  assert.equal(info.metadata.field, 'occurred_at');
  assert.equal(info.metadata.value, '1970-01-01T00:00:00.000Z');
  assert.equal(info.metadata.bound, 'max_timestamp_past');
  await assert.rejects(rb.getActivity({ activity_id: id }), { grpcStatus: 'NOT_FOUND' }, 'nothing was stored');
  // Through the client, the same Date arrives as itself.
  assert.deepEqual(toTimestamp(new Date('2024-05-01T00:00:00Z')), { seconds: 1714521600, nanos: 0 });
  await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', occurred_at: new Date() });
});

test('RecordSuccess closes an activity, idempotently; a later report is refused', async () => {
  const id = fresh('success');
  await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'transient', policy: POLICY, occurred_at: T0 });
  const done = await rb.recordSuccess({ activity_id: id, occurred_at: at(5) });
  assert.deepEqual(done, { status: 'ACTIVITY_STATUS_CLOSED', changed: true });
  assert.deepEqual(await rb.recordSuccess({ activity_id: id }), { status: 'ACTIVITY_STATUS_CLOSED', changed: false });

  const act = await rb.getActivity({ activity_id: id });
  assert.equal(act.closed_code, 'succeeded');
  assert.deepEqual(act.events.map((e) => [e.kind, e.code]), [['decision', 'schedule_retry'], ['success', 'succeeded']]);
  assert.deepEqual(act.events[1].occurred_at, at(5));

  await assert.rejects(rb.nextAction({ activity_id: id, attempt: 2, error_class: 'transient', occurred_at: at(10) }), {
    grpcStatus: 'FAILED_PRECONDITION',
    stableCode: 'activity_closed',
  });
  // A success for an activity the service never held closes nothing.
  assert.deepEqual(await rb.recordSuccess({ activity_id: fresh('never-failed') }), { status: 'ACTIVITY_STATUS_UNSPECIFIED', changed: false });
});

test('manual review parks an activity until ResolveActivity', async () => {
  const retried = fresh('review');
  const parked = await rb.nextAction({ activity_id: retried, attempt: 1, error_class: 'unknown', policy: POLICY, occurred_at: T0 });
  assert.equal(parked.code, 'manual_review');
  assert.equal((await rb.getActivity({ activity_id: retried })).status, 'ACTIVITY_STATUS_PARKED');
  await assert.rejects(rb.nextAction({ activity_id: retried, attempt: 2, error_class: 'transient', occurred_at: at(10) }), {
    stableCode: 'activity_parked',
  });
  assert.deepEqual(await rb.resolveActivity({ activity_id: retried, resolution: 'retry', note: 'ops: the charge never landed' }), {
    status: 'ACTIVITY_STATUS_OPEN',
  });
  const next = await rb.nextAction({ activity_id: retried, attempt: 2, error_class: 'transient', occurred_at: at(10) });
  assert.equal(next.code, 'schedule_retry');

  const failed = fresh('review');
  await rb.nextAction({ activity_id: failed, attempt: 1, error_class: 'unknown', occurred_at: T0 });
  assert.deepEqual(await rb.resolveActivity({ activity_id: failed, resolution: 'fail' }), { status: 'ACTIVITY_STATUS_CLOSED' });
  assert.equal((await rb.getActivity({ activity_id: failed })).closed_code, 'resolved_failed');
  await assert.rejects(rb.resolveActivity({ activity_id: failed, resolution: 'unspecified' }), {
    grpcStatus: 'INVALID_ARGUMENT',
    stableCode: 'unknown_resolution',
  });
});

test('tenants do not mix: x-tenant-id names the owner', async () => {
  const id = fresh('shared');
  await rb.nextAction({ activity_id: id, attempt: 1, error_class: 'permanent' });
  assert.equal((await rb.getActivity({ activity_id: id })).tenant, tenant);
  const other = new RetryBudgetClient(server.address, { tenant: `${tenant}-other` });
  try {
    await assert.rejects(other.getActivity({ activity_id: id }), { grpcStatus: 'NOT_FOUND', stableCode: 'activity_not_found' });
  } finally {
    other.close();
  }
});
