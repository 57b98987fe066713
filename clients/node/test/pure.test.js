// The pure calls (RetryDelay, NextAction with a budget), 64-bit integers and
// the checks a request gets before it is sent, against the real binary.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import { RetryBudgetClient, RetryBudgetError, fromTimestamp, toTimestamp } from '../retry_budget_client.js';
import { GLOBAL_BUDGET_ONLY, startServer } from '../testing/server.js';

let server;
let rb;

before(async () => {
  server = await startServer(GLOBAL_BUDGET_ONLY);
  rb = new RetryBudgetClient(server.address, { tenant: 'node-pure' });
});

after(async () => {
  rb?.close();
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
});

describe('RetryDelay', () => {
  // The article's printed outputs.
  for (const [activityId, expected] of [
    ['flight-1', [1, 2, 4, 11, 16, 35]],
    ['flight-2', [1, 2, 4, 15, 19, 54]],
  ]) {
    test(`reproduces the article's line for ${activityId}`, async () => {
      const delays = [];
      for (let attempt = 1; attempt <= 6; attempt++) {
        const r = await rb.retryDelay({ activity_id: activityId, attempt });
        assert.equal(typeof r.delay_ms, 'bigint');
        // the millisecond jitter stays within the reference's second
        assert.equal(r.delay_ms / 1000n, BigInt(r.delay_seconds));
        delays.push(r.delay_seconds);
      }
      assert.deepEqual(delays, expected);
    });
  }

  test('base and cap are optional: present 0 is not absent', async () => {
    const absent = await rb.retryDelay({ activity_id: 'flight-1', attempt: 4 });
    const zero = await rb.retryDelay({ activity_id: 'flight-1', attempt: 4, base: 0 });
    assert.equal(absent.delay_seconds, 11);
    assert.deepEqual(zero, { delay_seconds: 1, delay_ms: 1000n }); // the 1 s floor
  });
});

describe('NextAction, pure form', () => {
  // The article's next_action(Budget(attempts, max_attempts, elapsed, deadline), class).
  const cases = [
    [[1, 3, 5, 30], 'transient', 'ACTION_SCHEDULE_RETRY', 'schedule_retry'],
    [[3, 3, 5, 30], 'transient', 'ACTION_ATTEMPTS_EXHAUSTED', 'attempts_exhausted'],
    [[1, 3, 31, 30], 'transient', 'ACTION_DEADLINE_EXCEEDED', 'deadline_exceeded'],
    [[1, 3, 5, 30], 'permanent', 'ACTION_FAIL_PERMANENT', 'fail_permanent'],
    [[1, 3, 5, 30], 'unknown', 'ACTION_MANUAL_REVIEW', 'manual_review'],
  ];
  for (const [[attempts, max_attempts, elapsed, deadline], errorClass, action, code] of cases) {
    test(`reproduces the article: ${code}`, async () => {
      const r = await rb.nextAction({ budget: { attempts, max_attempts, elapsed, deadline }, error_class: errorClass });
      assert.equal(r.action, action);
      assert.equal(r.code, code);
      assert.equal(r.replayed, false);
      assert.equal(r.error_class, `ERROR_CLASS_${errorClass.toUpperCase()}`);
    });
  }
});

describe('64-bit integers', () => {
  const TWO_53 = 2n ** 53n;

  test('uint64 values past 2^53 reach the server exactly', async () => {
    const budget = (elapsed, deadline) => ({ budget: { attempts: 1, max_attempts: 3, elapsed, deadline }, error_class: 'transient' });
    // 2^53 s elapsed of a 2^53 + 1 s deadline: one second is left.
    const exact = await rb.nextAction(budget(TWO_53, TWO_53 + 1n));
    assert.equal(exact.code, 'schedule_retry');
    // What a Number would have sent: 2^53 + 1 rounds to 2^53, no time left.
    assert.equal(Number(TWO_53 + 1n), Number(TWO_53));
    const rounded = await rb.nextAction(budget(TWO_53, BigInt(Number(TWO_53 + 1n))));
    assert.equal(rounded.code, 'deadline_exceeded');
    // Decimal strings are exact too.
    const fromStrings = await rb.nextAction(budget(String(TWO_53), String(TWO_53 + 1n)));
    assert.equal(fromStrings.code, 'schedule_retry');
  });

  test('uint64 values come back as exact bigints', async () => {
    const max = 2n ** 64n - 1n;
    const d = await rb.nextAction({
      activity_id: `u64-${process.pid}`,
      attempt: 1,
      error_class: 'permanent',
      policy: { max_attempts: 2, deadline_seconds: max },
    });
    assert.equal(d.code, 'fail_permanent');
    assert.equal(d.policy.deadline_seconds, max);
    const act = await rb.getActivity({ activity_id: `u64-${process.pid}` });
    assert.equal(act.policy.deadline_seconds, max);
    assert.equal(typeof act.events[0].elapsed_seconds, 'bigint');
  });

  test('a number that is not a safe integer is refused before it is sent', async () => {
    await assert.rejects(
      rb.nextAction({ budget: { attempts: 1, max_attempts: 3, elapsed: 2 ** 53 + 2, deadline: 1 }, error_class: 'transient' }),
      (err) => err instanceof RangeError && /budget\.elapsed/.test(err.message) && /bigint or a decimal string/.test(err.message),
    );
  });

  test('out-of-range integers are refused, not wrapped', async () => {
    await assert.rejects(rb.retryDelay({ activity_id: 'x', attempt: 2 ** 32 }), RangeError); // uint32 would wrap to 0
    await assert.rejects(rb.retryDelay({ activity_id: 'x', attempt: -1 }), RangeError);
    await assert.rejects(rb.nextAction({ budget: { elapsed: -1n }, error_class: 'transient' }), RangeError);
    await assert.rejects(rb.nextAction({ budget: { elapsed: 2n ** 64n }, error_class: 'transient' }), RangeError);
  });
});

describe('requests are checked before they are sent', () => {
  test('a camelCase field name is an error, not a silently empty field', async () => {
    await assert.rejects(rb.getActivity({ activityId: 'charge-42' }), (err) => {
      assert.ok(err instanceof TypeError);
      assert.match(err.message, /has no field activityId/);
      assert.match(err.message, /activity_id/);
      return true;
    });
  });

  test('enums take full names, short names or numbers; anything else is an error', async () => {
    const budget = { attempts: 1, max_attempts: 3, elapsed: 5, deadline: 30 };
    for (const errorClass of ['ERROR_CLASS_PERMANENT', 'permanent', 'Permanent', 2]) {
      const r = await rb.nextAction({ budget, error_class: errorClass });
      assert.equal(r.code, 'fail_permanent', `error_class ${errorClass}`);
    }
    await assert.rejects(rb.nextAction({ budget, error_class: 'transiant' }), /not a value of retrybudget\.v1\.ErrorClass/);
  });

  test('a Date where a Timestamp goes is converted; anything else is an error', async () => {
    await assert.rejects(
      rb.recordSuccess({ activity_id: 'x', occurred_at: Date.now() }),
      (err) => err instanceof TypeError && /occurred_at/.test(err.message),
    );
    await assert.rejects(rb.recordSuccess({ activity_id: 'x', occurred_at: new Date('not a date') }), TypeError);
  });
});

describe('errors carry the gRPC code and the stable code', () => {
  test('attempt 0 is INVALID_ARGUMENT attempt_must_be_positive', async () => {
    await assert.rejects(rb.retryDelay({ activity_id: 'flight-1', attempt: 0 }), (err) => {
      assert.ok(err instanceof RetryBudgetError);
      assert.equal(err.grpcStatus, 'INVALID_ARGUMENT');
      assert.equal(err.code, 3);
      assert.equal(err.stableCode, 'attempt_must_be_positive');
      assert.match(err.details, /^attempt_must_be_positive: /);
      assert.equal(err.method, 'RetryDelay');
      assert.equal(err.retryPushbackMs, null);
      return true;
    });
  });

  test('an unspecified error class is INVALID_ARGUMENT unknown_error_class', async () => {
    await assert.rejects(
      rb.nextAction({ budget: { attempts: 1, max_attempts: 3, elapsed: 5, deadline: 30 }, error_class: 'unspecified' }),
      { grpcStatus: 'INVALID_ARGUMENT', stableCode: 'unknown_error_class' },
    );
  });
});

describe('Timestamp helpers', () => {
  test('a Date becomes {seconds, nanos}, before 1970 too', () => {
    assert.deepEqual(toTimestamp(new Date('2024-01-01T00:00:00.123Z')), { seconds: 1704067200, nanos: 123_000_000 });
    assert.deepEqual(toTimestamp(new Date(-1)), { seconds: -1, nanos: 999_000_000 });
    assert.deepEqual(toTimestamp({ seconds: '5' }), { seconds: '5', nanos: 0 });
    assert.throws(() => toTimestamp({ seconds: 1, nanos: 1e9 }), RangeError);
  });

  test('a decoded Timestamp becomes a Date at millisecond precision', () => {
    assert.equal(fromTimestamp({ seconds: '1704067200', nanos: 123_999_999 }).toISOString(), '2024-01-01T00:00:00.123Z');
    assert.equal(fromTimestamp(null), null);
  });
});
