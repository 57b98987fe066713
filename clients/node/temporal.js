// Temporal (@temporalio/worker): an activity wrapper whose retries
// retry-budget plans (the Node.js twin of clients/python/retry_budget/temporal.py).
//
//   import { withRetryBudget } from 'retry-budget-client/temporal';
//
//   export const charge = withRetryBudget({
//     server: 'retry-budget:50051', tenant: 'checkout', dependency: 'payments-api',
//     policy: { max_attempts: 5, deadline_seconds: 600 },
//   }, async (orderId) => { ... });
//   // Worker.create({ ..., activities: { charge } }); charge.close() on shutdown
//
// On an error the activity asks NextAction (activity id
// `<workflow id>:<activity id>`, the attempt from the activity's
// `Context.current().info.attempt`, the error classified) and throws
// Temporal's ApplicationFailure in its place, the original as its cause and
// the decision ({ code, reason, attempt, not_before in Unix seconds }) as its
// details:
// - a retry: `nextRetryDelay` = the planned wait, so Temporal's server runs
//   the next attempt at the service's `not_before` instead of its own backoff;
// - a deferral: a retry at `not_before`; that attempt asks the deferred one
//   again before it runs (Advisor.begin), which takes the booked slot's token;
// - a stop: `nonRetryable`, so Temporal's server retries no more.
// A success calls RecordSuccess with the dependency. When the service cannot
// be reached, the original error is thrown unchanged and the activity's own
// RetryPolicy applies (logged once). Temporal's RetryPolicy beside it: as in
// docs/integrations.md (maximumAttempts 0, or room for the deferrals).

import { Context } from '@temporalio/activity';
import { ApplicationFailure } from '@temporalio/common';

import { Advisor } from './advisor.js';

/** The ApplicationFailure `type` of an attempt deferred before it ran. */
export const DEFERRED_TYPE = 'RetryBudgetDeferred';
/** The ApplicationFailure `type` of an attempt stopped before it ran. */
export const STOPPED_TYPE = 'RetryBudgetStopped';

// Temporal treats a zero nextRetryDelay as unset (its own backoff): a
// not_before that has already passed becomes the smallest real delay.
const MIN_DELAY_MS = 1;

/** The activity id sent to the service: `<workflow id>:<activity id>`. */
export function activityKey(info) {
  const workflowId = info.workflowExecution?.workflowId;
  return workflowId ? `${workflowId}:${info.activityId}` : info.activityId;
}

/** The ApplicationFailure that makes Temporal's server do what `plan` says. */
export function toApplicationFailure(plan, err) {
  const ran = err !== undefined;
  const message = ran ? String(err?.message ?? err) : `retry-budget: ${plan.code} (${plan.reason})`;
  const type = ran ? (err?.name ?? 'Error') : plan.kind === 'stop' ? STOPPED_TYPE : DEFERRED_TYPE;
  const details = [{
    code: plan.code, reason: plan.reason, attempt: plan.attempt,
    not_before: plan.notBefore === null ? null : plan.notBefore / 1000,
  }];
  const cause = err instanceof Error ? err : undefined;
  if (plan.kind === 'stop') return ApplicationFailure.create({ message, type, details, cause, nonRetryable: true });
  const nextRetryDelay = Math.max(MIN_DELAY_MS, (plan.notBefore ?? Date.now()) - Date.now());
  return ApplicationFailure.create({ message, type, details, cause, nextRetryDelay });
}

/**
 * Wraps an activity function `(...args) => Promise<result>`.
 * @param {object} settings the Advisor's (server, tenant, dependency, policy, classify, deadlineMs,
 *   apiKey, logger, trafficIntervalMs).
 * @returns the activity, with `close()`: sends the traffic counts left and closes the channel.
 */
export function withRetryBudget(settings, fn) {
  const advisor = new Advisor(settings, 'Temporal');
  async function budgeted(...args) {
    const { info } = Context.current();
    const key = activityKey(info);
    const gate = await advisor.begin(key, info.attempt);
    if (gate.kind === 'defer' || gate.kind === 'stop') throw toApplicationFailure(gate);
    const attempt = gate.kind === 'fallback' ? info.attempt : gate.attempt;
    let result;
    try {
      result = await fn.apply(this, args);
    } catch (err) {
      advisor.countFailure();
      const plan = await advisor.failed(key, attempt, err, {
        workflowId: info.workflowExecution?.workflowId ?? '', frameworkAttempt: info.attempt,
      });
      if (plan.kind === 'fallback') throw err; // the activity's own RetryPolicy decides
      throw toApplicationFailure(plan, err);
    }
    await advisor.succeeded(key);
    return result;
  }
  budgeted.close = () => advisor.close();
  return budgeted;
}
