// Failures the real binary cannot be made to produce on demand: a store that
// pushes back (UNAVAILABLE store_backlogged with grpc-retry-pushback-ms,
// which the embedded store sends only while checkpoints fall behind) and a
// call that misses its deadline. A grpc-js stand-in serving the same proto
// plays the server for those; the real binary then classifies the pushback
// when a worker reports it as a dependency's failure.

import assert from 'node:assert/strict';
import { after, before, describe, test } from 'node:test';

import {
  RETRY_PUSHBACK_TRAILER,
  RetryBudgetClient,
  RetryBudgetError,
  grpc,
  grpcErrorDetail,
  packageDefinition,
  retryPushbackMs,
} from '../retry_budget_client.js';
import { startServer } from '../testing/server.js';

// A RetryBudget server whose every call fails as `fail` says, or never
// answers when `fail` returns null.
async function startStandIn(fail) {
  const server = new grpc.Server();
  const service = grpc.loadPackageDefinition(packageDefinition).retrybudget.v1.RetryBudget.service;
  const handler = (call, callback) => {
    const status = fail(call);
    if (status) callback(status);
  };
  server.addService(service, Object.fromEntries(Object.keys(service).map((name) => [name, handler])));
  const port = await new Promise((resolve, reject) =>
    server.bindAsync('127.0.0.1:0', grpc.ServerCredentials.createInsecure(), (err, p) => (err ? reject(err) : resolve(p))),
  );
  return { address: `127.0.0.1:${port}`, stop: () => server.forceShutdown() };
}

function backlogged(pushback) {
  const metadata = new grpc.Metadata();
  metadata.set(RETRY_PUSHBACK_TRAILER, pushback);
  return {
    code: grpc.status.UNAVAILABLE,
    details: 'store_backlogged: checkpoints are behind; ask again later',
    metadata,
  };
}

describe('a stand-in server', () => {
  let standIn;
  let lastPushback = '1500';
  let tenantSeen;

  before(async () => {
    standIn = await startStandIn((call) => {
      tenantSeen = call.metadata.get('x-tenant-id')[0];
      return call.request.activity_id === 'hang' ? null : backlogged(lastPushback);
    });
  });

  after(() => standIn.stop());

  test('UNAVAILABLE with a pushback trailer surfaces the stable code and the wait', async () => {
    const rb = new RetryBudgetClient(standIn.address, { tenant: 'acme' });
    try {
      await assert.rejects(rb.getActivity({ activity_id: 'charge-42' }), (err) => {
        assert.ok(err instanceof RetryBudgetError);
        assert.equal(err.code, grpc.status.UNAVAILABLE);
        assert.equal(err.grpcStatus, 'UNAVAILABLE');
        assert.equal(err.stableCode, 'store_backlogged');
        assert.equal(err.retryPushbackMs, 1500);
        assert.equal(err.method, 'GetActivity');
        return true;
      });
      assert.equal(tenantSeen, 'acme', 'the tenant goes as x-tenant-id');

      lastPushback = 'soon'; // not an integer: gRFC A6 reads it as "do not retry"
      await assert.rejects(rb.getActivity({ activity_id: 'charge-42' }), { retryPushbackMs: -1 });
    } finally {
      lastPushback = '1500';
      rb.close();
    }
  });

  test('a call that misses its deadline is DEADLINE_EXCEEDED with no stable code', async () => {
    const rb = new RetryBudgetClient(standIn.address, { deadlineMs: 10_000 });
    try {
      const started = Date.now();
      await assert.rejects(rb.getActivity({ activity_id: 'hang' }, { deadlineMs: 200 }), {
        grpcStatus: 'DEADLINE_EXCEEDED',
        stableCode: null,
        retryPushbackMs: null,
      });
      const took = Date.now() - started;
      assert.ok(took >= 150 && took < 5000, `the per-call deadline applied (${took} ms)`);
    } finally {
      rb.close();
    }
  });

  test("a dependency's pushback, reported as ErrorDetail, is planned with by the real service", async () => {
    const dependency = new RetryBudgetClient(standIn.address);
    let failure;
    try {
      failure = await dependency.getActivity({ activity_id: 'charge-42' }).catch((err) => err);
    } finally {
      dependency.close();
    }
    const error = { ...grpcErrorDetail(failure.cause), safety: 'idempotent' };
    assert.deepEqual(error, { grpc_code: 14, grpc_retry_pushback_ms: 1500, safety: 'idempotent' });

    const server = await startServer();
    const rb = new RetryBudgetClient(server.address, { tenant: 'node-errors' });
    try {
      const occurred = new Date(Math.floor(Date.now() / 1000) * 1000 - 60_000);
      const d = await rb.nextAction({
        activity_id: 'pushback-1',
        attempt: 1,
        error,
        policy: { max_attempts: 3, deadline_seconds: 600 },
        occurred_at: occurred,
      });
      assert.equal(d.code, 'schedule_retry');
      assert.equal(d.error_class, 'ERROR_CLASS_TRANSIENT');
      assert.notEqual(d.rule, '', 'the service names the rule that classified it');
      assert.deepEqual(d.hint, { delay_ms: 1500n, source: 'grpc_retry_pushback', capped: false, do_not_retry: false, ignored: [] });
      assert.ok(d.delay_ms >= 1500n, 'the delay is max(backoff, hint)');
      assert.equal(d.not_before.getTime(), occurred.getTime() + Number(d.delay_ms));
    } finally {
      rb.close();
      assert.equal(await server.stop(), 0);
    }
  });
});

test('retryPushbackMs reads the trailer as gRFC A6 does', () => {
  const md = (value) => {
    const m = new grpc.Metadata();
    if (value !== undefined) m.set(RETRY_PUSHBACK_TRAILER, value);
    return m;
  };
  assert.equal(retryPushbackMs(md()), null);
  assert.equal(retryPushbackMs(md('0')), 0);
  assert.equal(retryPushbackMs(md(' 250 ')), 250);
  assert.equal(retryPushbackMs(md('-5')), -1);
  assert.equal(retryPushbackMs(md('1.5')), -1);
  assert.equal(retryPushbackMs(undefined), null);
});
