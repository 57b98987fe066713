// BullMQ: a backoff strategy whose delays retry-budget plans.
//
//   import { Worker } from 'bullmq';
//   import { RetryBudgetBackoff } from 'retry-budget-client/bullmq';
//
//   const budget = new RetryBudgetBackoff({
//     server: 'retry-budget:50051', tenant: 'mailer', dependency: 'smtp',
//     policy: { max_attempts: 5, deadline_seconds: 600 },
//     fallback: { type: 'exponential', delay: 1000 },   // BullMQ's own, while the service is down
//   });
//   new Worker('mail', budget.processor(send), {
//     connection, settings: { backoffStrategy: budget.backoffStrategy },
//   });
//   await queue.add('send', data, { attempts: 20, backoff: { type: 'retry-budget' } });
//
// - `backoffStrategy` (BullMQ's `settings.backoffStrategy`): for a failed
//   job it asks NextAction (activity id `<queue name>:<job id>`, the attempt
//   BullMQ passes, the error classified) and returns the planned delay in
//   milliseconds: BullMQ moves the job to its delayed set until the
//   service's `not_before`. A stop returns -1: BullMQ fails the job, no retry.
// - `processor(fn)` wraps the job's function: a stop becomes BullMQ's
//   `UnrecoverableError` (so BullMQ retries no more, whatever `attempts`
//   says, and the job's failedReason names the stable code); a retry's
//   decision travels on the error to the strategy, so NextAction is asked
//   once; a job that comes back after a deferral asks the deferred attempt
//   again before it runs (taking the booked slot's token) and is delayed
//   again, without using one of BullMQ's attempts, if its slot is not there
//   yet; a success calls RecordSuccess with the dependency. Every run of
//   the job's function is counted for the traffic reports (a success or a
//   failure of the dependency; a DelayedError or RateLimitError it throws
//   itself is neither), sent in the background about once a second; the
//   strategy alone counts the failures it is asked about.
//
// When the service cannot be reached the strategy returns what BullMQ's own
// `fallback` backoff (`fixed` or `exponential`, with `delay` and `jitter`)
// would, and says so once. `attempts` on the job is BullMQ's own cap: set it
// above the policy's max_attempts (deferrals count as BullMQ attempts too),
// so that the service, not BullMQ, decides when to stop.

import { Backoffs, DelayedError, UnrecoverableError } from 'bullmq';

import { Advisor } from './advisor.js';

/** The `backoff.type` jobs name to use this strategy. */
export const BACKOFF_TYPE = 'retry-budget';

const PLAN = Symbol('retry-budget plan');

/** The activity id sent to the service for a job: `<queue name>:<job id>`. */
export const activityKey = (job) => `${job.queueName}:${job.id}`;

export class RetryBudgetBackoff {
  /**
   * @param {object} settings the Advisor's settings (server, tenant, dependency, policy, classify,
   *   deadlineMs, apiKey, logger, trafficIntervalMs), and:
   * @param {{type: 'fixed' | 'exponential', delay: number, jitter?: number}} [settings.fallback]
   *   BullMQ's own backoff, used while the service cannot be reached (default exponential, 1 s).
   */
  constructor({ fallback = { type: 'exponential', delay: 1000 }, ...settings }) {
    this.advisor = new Advisor(settings, 'BullMQ');
    this.fallback = fallback;
    /** BullMQ's `settings.backoffStrategy`: (attemptsMade, type, err, job) => delay ms, or -1. */
    this.backoffStrategy = (attemptsMade, type, err, job) => this.delayFor(attemptsMade, type, err, job);
  }

  /** Sends the traffic counts left and closes the channel; the promise never rejects. */
  close() {
    return this.advisor.close();
  }

  fallbackDelay(attemptsMade) {
    return Backoffs.builtinStrategies[this.fallback.type](this.fallback.delay, this.fallback.jitter)(attemptsMade);
  }

  static delayOf(plan) {
    if (plan.kind === 'stop') return -1;
    // 0 would make BullMQ retry at once rather than delay: at least 1 ms.
    return Math.max(1, (plan.notBefore ?? Date.now()) - Date.now());
  }

  async delayFor(attemptsMade, type, err, job) {
    let plan = err?.[PLAN];
    if (!plan) {
      // Without processor(): the failure was counted by no one yet.
      this.advisor.countFailure();
      plan = await this.advisor.failed(activityKey(job), attemptsMade, err, { workflowId: job.parentKey ?? '' });
    }
    if (plan.kind === 'fallback') return this.fallbackDelay(attemptsMade);
    return RetryBudgetBackoff.delayOf(plan);
  }

  /** Wraps a BullMQ processor `(job, token) => result`. */
  processor(fn) {
    return async (job, token) => {
      const key = activityKey(job);
      const frameworkAttempt = job.attemptsMade + 1;
      let attempt = frameworkAttempt;
      if (frameworkAttempt > 1) {
        const gate = await this.advisor.begin(key, frameworkAttempt);
        if (gate.kind === 'defer') {
          await job.moveToDelayed(gate.notBefore, token); // not one of BullMQ's attempts
          throw new DelayedError();
        }
        if (gate.kind === 'stop') throw new UnrecoverableError(`retry-budget: ${gate.code}: ${gate.reason}`);
        if (gate.kind === 'run') attempt = gate.attempt;
      }
      let result;
      try {
        result = await fn(job, token);
      } catch (err) {
        // Control flow the job asked for itself: no answer of the dependency.
        if (err instanceof DelayedError || err?.name === 'RateLimitError') throw err;
        this.advisor.countFailure();
        if (err instanceof UnrecoverableError) throw err;
        const plan = await this.advisor.failed(key, attempt, err, { workflowId: job.parentKey ?? '', frameworkAttempt });
        if (plan.kind === 'stop') {
          const stop = new UnrecoverableError(`retry-budget: ${plan.code}: ${plan.reason} (${err?.message ?? err})`);
          stop.cause = err;
          throw stop;
        }
        if (err !== null && typeof err === 'object') err[PLAN] = plan;
        throw err;
      }
      await this.advisor.succeeded(key);
      return result;
    };
  }
}
