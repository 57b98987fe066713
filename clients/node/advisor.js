// What a framework integration asks the service, in one place (the Node.js
// twin of clients/python/retry_budget/advisor.py).
//
// A framework runs an attempt; the integration tells the Advisor how it
// ended and gets a plan back:
// - failed(): NextAction, durable form: a retry at `notBefore`, a deferral
//   (the global budget is exhausted: come back at `notBefore`, same
//   attempt), a stop with its stable code, or a fallback (the service could
//   not answer: use the framework's own retry settings; said once in the
//   log, not on every failure);
// - begin(): before the framework's re-run, the attempt the service expects.
//   After a deferral the job comes back at the booked slot; asking the
//   deferred attempt again there takes the slot's token before it runs;
// - succeeded(): RecordSuccess.
//
// Each also counts the call the framework ran for the traffic reports
// (traffic.js): countFailure() after a failed one, succeeded() after a
// successful one. The successes a tenant reports earn it retries of its
// own on top of the dependency's shared allowance, so a worker that did not
// count them would get only the shared allowance.
//
// The attempt is the framework's own; the service counts attempts without
// gaps and a deferral consumes none, so after a deferral or a period when
// the service was down the service's next attempt (from GetActivity) is
// reported instead, and the log line names both.
//
// `dependency` goes into every log line, every NextAction and
// RecordSuccess, and the traffic counts.

import { RetryBudgetClient } from './retry_budget_client.js';
import { DEFAULT_TRAFFIC_INTERVAL_MS, validateDependency } from './traffic.js';

/** gRPC status names that mean the service did not decide: fall back. */
const UNREACHABLE = new Set([
  'UNAVAILABLE', 'DEADLINE_EXCEEDED', 'ABORTED', 'RESOURCE_EXHAUSTED', 'INTERNAL', 'UNKNOWN', 'CANCELLED',
]);

/**
 * Connection errors and timeouts (Node's `ECONNREFUSED`, `ETIMEDOUT`, ...,
 * `AbortError`, `TimeoutError`) are transient; `TypeError`, `RangeError`
 * and `SyntaxError` permanent; anything else unknown (the service parks it
 * for review). An error may say it itself with a `retryBudgetClass`.
 */
export function classifyDefault(err) {
  if (typeof err?.retryBudgetClass === 'string') return err.retryBudgetClass;
  const code = err?.code;
  if (typeof code === 'string' && /^(ECONN|ETIMEDOUT|EPIPE|EAI_AGAIN|ENOTFOUND|EHOSTUNREACH|ENETUNREACH)/.test(code)) {
    return 'transient';
  }
  if (err?.name === 'AbortError' || err?.name === 'TimeoutError') return 'transient';
  if (err instanceof TypeError || err instanceof RangeError || err instanceof SyntaxError) return 'permanent';
  return 'unknown';
}

const toMs = (date) => (date instanceof Date ? date.getTime() : null);

/** One integration's link to the service. */
export class Advisor {
  /**
   * @param {object} settings
   * @param {string} settings.server host:port of the retry-budget server.
   * @param {string} [settings.tenant] sent as x-tenant-id.
   * @param {string} [settings.dependency] what the job calls ('payments-api'; up to 64 printable ASCII
   *   characters without spaces): named in every NextAction and RecordSuccess, so a retry takes a token of
   *   its budget, and in the traffic counts, whose successes earn the tenant retries of its own on it. '' is
   *   the default dependency.
   * @param {object} [settings.policy] { max_attempts, deadline_seconds, base, cap } on the first report.
   * @param {(err: Error) => string | object} [settings.classify] a class name or an ErrorDetail object.
   * @param {number} [settings.deadlineMs] how long one call may take (default 2000).
   * @param {string} [settings.apiKey] for a server run with --auth api-keys.
   * @param {{info: Function, warn: Function, error: Function}} [settings.logger] default: console.
   * @param {number | null} [settings.trafficIntervalMs] how often the calls counted are sent
   *   (ReportTraffic), default 1000; null turns counting off.
   * @param {string} framework named in the fallback message.
   */
  constructor(settings, framework) {
    this.settings = {
      dependency: '', classify: classifyDefault, deadlineMs: 2000, logger: console,
      trafficIntervalMs: DEFAULT_TRAFFIC_INTERVAL_MS, ...settings,
    };
    // A name the service refuses would make every report fail: say so
    // where the settings are written, not on the first failure.
    validateDependency(this.settings.dependency);
    this.framework = framework;
    this.client = new RetryBudgetClient(this.settings.server, {
      tenant: this.settings.tenant,
      apiKey: this.settings.apiKey,
      deadlineMs: this.settings.deadlineMs,
      trafficIntervalMs: this.settings.trafficIntervalMs,
      logger: this.settings.logger,
    });
    this.down = false;
  }

  /** Sends the traffic counts left and closes the channel; never rejects. */
  close() {
    return this.client.close();
  }

  get log() {
    return this.settings.logger;
  }

  reached() {
    if (this.down) {
      this.down = false;
      this.log.warn(`retry-budget at ${this.settings.server} answers again: its decisions apply again ` +
        `(dependency=${this.settings.dependency})`);
    }
  }

  fallback(err, activityId, attempt) {
    if (UNREACHABLE.has(err?.grpcStatus)) {
      if (!this.down) {
        this.down = true;
        this.log.warn(`retry-budget at ${this.settings.server} cannot be reached (${err.grpcStatus}: ` +
          `${err.details}): falling back to ${this.framework}'s own retry settings until it answers ` +
          `(activity=${activityId} dependency=${this.settings.dependency})`);
      }
    } else if (err?.grpcStatus === undefined) {
      // Not the service's answer: a classifier that threw, a policy the
      // client refuses. The workers go on with their own settings, loudly.
      this.log.error(`retry-budget integration failed for activity=${activityId} attempt=${attempt}: ` +
        `${err?.stack ?? err}: falling back to ${this.framework}'s own retry settings ` +
        `(dependency=${this.settings.dependency})`);
      return { kind: 'fallback', attempt, code: 'integration_error', reason: String(err), notBefore: null };
    } else {
      this.log.error(`retry-budget refused activity=${activityId} attempt=${attempt} (${err.grpcStatus}: ` +
        `${err.details}): falling back to ${this.framework}'s own retry settings ` +
        `(dependency=${this.settings.dependency})`);
    }
    return { kind: 'fallback', attempt, code: 'unreachable', reason: err.details ?? '', notBefore: null };
  }

  record(activityId, plan, frameworkAttempt) {
    const nb = plan.notBefore === null ? '' : new Date(plan.notBefore).toISOString();
    const seen = frameworkAttempt === plan.attempt ? '' : ` ${this.framework.toLowerCase()}_attempt=${frameworkAttempt}`;
    this.log.info(`retry-budget ${plan.kind}: activity=${activityId} attempt=${plan.attempt}${seen} ` +
      `dependency=${this.settings.dependency} code=${plan.code} not_before=${nb} reason=${plan.reason}`);
  }

  request(activityId, attempt, classification, occurredAt, workflowId) {
    const req = { activity_id: activityId, attempt, occurred_at: occurredAt, workflow_id: workflowId ?? '' };
    if (typeof classification === 'string') req.error_class = classification;
    else req.error = classification;
    if (this.settings.policy) req.policy = this.settings.policy;
    req.dependency = this.settings.dependency;
    return req;
  }

  async ask(req) {
    const r = await this.client.nextAction(req);
    const kind = r.action === 'ACTION_SCHEDULE_RETRY' ? 'retry' : r.action === 'ACTION_DEFERRED' ? 'defer' : 'stop';
    return { kind, attempt: req.attempt, code: r.code, reason: r.reason, notBefore: toMs(r.not_before) };
  }

  /**
   * The deferral the activity waits on, if its last decision is one (a
   * deferral consumes no attempt, so it is about attempts + 1); else null.
   */
  static pendingDeferral(act) {
    const decisions = act.events.filter((e) => e.kind === 'decision');
    const last = decisions.at(-1);
    return last && last.attempt === act.attempts + 1 && last.code === 'deferred' ? last : null;
  }

  /** When the deferred attempt may be asked again: the booked slot, else the deferral's not_before. */
  static slot(act, deferral) {
    return (act.reservation_not_before ?? deferral.not_before).getTime();
  }

  /** Asks the deferred attempt again, with its class and time (a booked slot pays for it). */
  async redeem(act, deferral, activityId) {
    return this.ask(this.request(activityId, deferral.attempt, deferral.error_class, deferral.occurred_at, act.workflow_id));
  }

  /** Before the framework's attempt `frameworkAttempt` runs: run, defer, stop or fallback. */
  async begin(activityId, frameworkAttempt) {
    try {
      return await this.gate(activityId, frameworkAttempt);
    } catch (err) {
      return { ...this.fallback(err, activityId, frameworkAttempt), attempt: frameworkAttempt };
    }
  }

  async gate(activityId, frameworkAttempt) {
    if (frameworkAttempt <= 1) return { kind: 'run', attempt: 1, code: '', reason: '', notBefore: null };
    let act;
    try {
      act = await this.client.getActivity({ activity_id: activityId });
    } catch (err) {
      if (err.grpcStatus === 'NOT_FOUND') {
        this.reached();
        return { kind: 'run', attempt: 1, code: '', reason: '', notBefore: null };
      }
      return { ...this.fallback(err, activityId, frameworkAttempt), attempt: frameworkAttempt };
    }
    this.reached();
    if (act.status === 'ACTIVITY_STATUS_PARKED') {
      const plan = { kind: 'stop', attempt: act.attempts, code: 'manual_review', reason: 'parked for manual review', notBefore: null };
      this.record(activityId, plan, frameworkAttempt);
      return plan;
    }
    if (act.status === 'ACTIVITY_STATUS_CLOSED' && act.closed_code !== 'succeeded') {
      const plan = { kind: 'stop', attempt: act.attempts, code: act.closed_code, reason: 'the activity is closed', notBefore: null };
      this.record(activityId, plan, frameworkAttempt);
      return plan;
    }
    const deferral = Advisor.pendingDeferral(act);
    if (deferral) {
      const slot = Advisor.slot(act, deferral);
      if (Date.now() < slot) {
        return { kind: 'defer', attempt: deferral.attempt, code: 'deferred', reason: 'the deferral\'s slot is ahead', notBefore: slot };
      }
      let plan;
      try {
        plan = await this.redeem(act, deferral, activityId);
      } catch (err) {
        return { ...this.fallback(err, activityId, frameworkAttempt), attempt: frameworkAttempt };
      }
      this.record(activityId, plan, frameworkAttempt - 1);
      if (plan.kind !== 'retry') return plan;
      return { ...plan, kind: 'run', attempt: plan.attempt + 1 };
    }
    return { kind: 'run', attempt: act.attempts + 1, code: '', reason: '', notBefore: null };
  }

  /** After attempt `attempt` failed with `err`: the service's plan. */
  async failed(activityId, attempt, err, { workflowId = '', occurredAt = new Date(), frameworkAttempt = attempt } = {}) {
    let plan;
    let classification;
    try {
      classification = this.settings.classify(err);
      try {
        plan = await this.ask(this.request(activityId, attempt, classification, occurredAt, workflowId));
      } catch (e) {
        if (e.stableCode !== 'attempt_out_of_order') throw e;
        // The service's count is behind the framework's: report its next attempt.
        const act = await this.client.getActivity({ activity_id: activityId });
        attempt = act.attempts + 1;
        const deferral = Advisor.pendingDeferral(act);
        if (deferral) {
          const redeemed = await this.redeem(act, deferral, activityId);
          if (redeemed.kind !== 'retry') {
            this.reached();
            this.record(activityId, redeemed, frameworkAttempt);
            return redeemed;
          }
          attempt += 1;
        }
        plan = await this.ask(this.request(activityId, attempt, classification, occurredAt, workflowId));
      }
    } catch (e) {
      if (e.stableCode === 'activity_closed' || e.stableCode === 'activity_parked') {
        this.reached();
        plan = { kind: 'stop', attempt, code: e.stableCode, reason: e.details, notBefore: null };
        this.record(activityId, plan, frameworkAttempt);
        return plan;
      }
      return this.fallback(e, activityId, attempt);
    }
    this.reached();
    this.record(activityId, plan, frameworkAttempt);
    return plan;
  }

  /**
   * Counts one failed call to the dependency for the traffic reports.
   * Called once per failed attempt, not per question about it.
   */
  countFailure() {
    this.client.recordCall(this.settings.dependency, false);
  }

  /** RecordSuccess, and the successful call counted; a service that cannot be reached is logged, never thrown. */
  async succeeded(activityId) {
    const { dependency } = this.settings;
    const req = { activity_id: activityId, dependency };
    try {
      const r = await this.client.recordSuccess(req);
      // The service counted the success with the RecordSuccess (every one
      // counts a success of its dependency): the report adds the call only.
      this.client.recordCall(dependency, true, { successRecorded: true });
      this.reached();
      this.log.info(`retry-budget success: activity=${activityId} dependency=${this.settings.dependency} ` +
        `status=${r.status} changed=${r.changed}`);
    } catch (err) {
      // Not counted by the service: the traffic report carries it.
      this.client.recordCall(dependency, true);
      this.fallback(err, activityId, 0);
    }
  }
}
