// The loop a durable-execution worker follows with retry-budget.
//
//     node worker_example.js --server 127.0.0.1:50051
//
// It runs one activity against a flaky fake dependency that fails with a
// transient error the first N times (--failures), and for each failure:
//
//   1. reports it (NextAction, durable form: activity_id, attempt,
//      error_class, policy, occurred_at, and the dependency the call went
//      to); the service counts the attempts, decides, and makes the
//      decision durable before it replies;
//   2. on schedule_retry, waits until `not_before`, then runs the next
//      attempt; on deferred, waits until `not_before` and reports the same
//      attempt again (a slot is booked for it then); on anything else
//      (attempts_exhausted, deadline_exceeded, fail_permanent,
//      manual_review) stops: the activity is closed or parked;
//   3. on success, RecordSuccess closes the activity; with the dependency,
//      it also counts one success of it.
//
// Every call is counted in the client (`client.recordCall`), which sends
// the counts by itself about once a second (ReportTraffic): the service
// allows a dependency's retries in proportion to its successes.
//
// The attempt counter is not trusted to worker memory: on start the worker
// asks GetActivity whether the activity already has failures recorded (a
// restarted worker) and continues from there. In a real worker, attempt and
// occurred_at come from the workflow's own history, so a replay gets the
// same plan.
//
// Exit status: 0 when the activity succeeded, 1 when it stopped on a
// terminal action, 2 on a usage or connection error.

import { randomUUID } from 'node:crypto';
import { setTimeout as sleep } from 'node:timers/promises';
import { pathToFileURL } from 'node:url';
import { parseArgs } from 'node:util';

import { RetryBudgetClient, RetryBudgetError, grpc, validateDependency } from './retry_budget_client.js';

/** A failure that may succeed when tried again (timeout, 503, reset). */
export class TransientError extends Error {}

/** A failure that will fail again (validation, auth, not found). */
export class PermanentError extends Error {}

/** A fake downstream service: fails `failures` times, then succeeds. */
export class FlakyDependency {
  constructor(failures, ErrorType = TransientError, name = 'flaky-api') {
    /** What NextAction, RecordSuccess and the traffic counts call it. */
    this.name = name;
    this.failures = failures;
    this.ErrorType = ErrorType;
    this.calls = 0;
  }

  async call(payload) {
    this.calls += 1;
    if (this.calls <= this.failures) {
      throw new this.ErrorType(`dependency unavailable (call ${this.calls})`);
    }
    return `ok: ${payload}`;
  }
}

/** `catch (err)` is not a classification: map what you know. */
export function classify(err) {
  if (err instanceof TransientError) return 'transient';
  if (err instanceof PermanentError) return 'permanent';
  return 'unknown';
}

// Node's timers fire after 1 ms when asked for more than 2^31 - 1 ms (about
// 24.8 days), and a policy's cap may be longer: wait in steps below that.
const MAX_TIMER_MS = 2 ** 31 - 1;

async function sleepUntil(date, log) {
  let wait = date.getTime() - Date.now();
  if (wait > 0) log(`  sleeping ${(wait / 1000).toFixed(3)} s until not_before`);
  while (wait > 0) {
    await sleep(Math.min(wait, MAX_TIMER_MS));
    wait = date.getTime() - Date.now();
  }
}

// Reports one failed attempt until the answer is not a deferral: a deferral
// consumes no attempt, so the same attempt is reported again at its
// not_before, when the slot booked for it comes, never in a busy loop.
async function report(client, activityId, attempt, errorClass, policy, occurredAt, dependency, log) {
  for (;;) {
    const decision = await client.nextAction({
      activity_id: activityId,
      attempt,
      error_class: errorClass,
      policy,
      occurred_at: occurredAt,
      dependency,
    });
    log(`  decision: ${decision.code}${decision.replayed ? ' (replayed)' : ''} -- ${decision.reason}`);
    if (decision.code !== 'deferred') return decision;
    log(`  deferred: ${decision.defer_reason}`);
    await sleepUntil(decision.not_before, log);
  }
}

/**
 * Runs the activity to its end and returns the closing code: 'succeeded',
 * or the stop code (attempts_exhausted, deadline_exceeded, fail_permanent,
 * manual_review, or the closed_code of an activity found already closed).
 */
export async function runActivity(client, activityId, dependency, policy, log = console.log) {
  let attempt = 1;
  let known = null;
  try {
    known = await client.getActivity({ activity_id: activityId });
  } catch (err) {
    if (!(err instanceof RetryBudgetError) || err.code !== grpc.status.NOT_FOUND) throw err;
  }
  if (known !== null) {
    if (known.status !== 'ACTIVITY_STATUS_OPEN') {
      log(`activity ${activityId} is already ${known.status} (${known.closed_code})`);
      return known.closed_code || 'parked';
    }
    // A restarted worker: continue after the last recorded failure.
    attempt = known.attempts + 1;
    const decisions = known.events.filter((e) => e.kind === 'decision');
    const last = decisions.at(-1);
    if (last?.code === 'deferred' && last.attempt === attempt) {
      // It stopped while deferred: that failure is reported but not yet
      // decided. Report it again when its slot comes; do not run it twice.
      log(`resuming activity ${activityId}: attempt ${attempt} was deferred`);
      const decision = await report(client, activityId, attempt, last.error_class, policy, last.occurred_at, dependency.name, log);
      if (decision.code !== 'schedule_retry') return decision.code;
      await sleepUntil(decision.not_before, log);
      attempt += 1;
    } else if (last?.not_before) {
      await sleepUntil(last.not_before, log);
    }
    log(`resuming activity ${activityId} at attempt ${attempt}`);
  }

  for (;;) {
    log(`attempt ${attempt}: calling the dependency`);
    let result;
    try {
      result = await dependency.call(activityId);
    } catch (err) {
      client.recordCall(dependency.name, false);
      const errorClass = classify(err);
      const occurredAt = new Date(); // in a real worker: from the history
      log(`attempt ${attempt} failed (${errorClass}): ${err.message}`);
      const decision = await report(client, activityId, attempt, errorClass, policy, occurredAt, dependency.name, log);
      if (decision.code !== 'schedule_retry') {
        log(`stopping: ${decision.code}`);
        return decision.code;
      }
      await sleepUntil(decision.not_before, log);
      attempt += 1;
      continue;
    }
    log(`attempt ${attempt} succeeded: ${result}`);
    const done = await client.recordSuccess({ activity_id: activityId, dependency: dependency.name });
    // The service counted the success with RecordSuccess: the call only.
    client.recordCall(dependency.name, true, { successRecorded: true });
    log(`recorded success: ${done.status}`);
    return 'succeeded';
  }
}

const USAGE = `usage: node worker_example.js [--server HOST:PORT] [--tenant NAME] [--api-key KEY] [--activity-id ID]
       [--failures N] [--error transient|permanent] [--dependency NAME] [--max-attempts N] [--deadline SECONDS]
       [--base SECONDS] [--cap SECONDS]`;

function integer(options, name) {
  const n = Number(options[name]);
  if (!Number.isSafeInteger(n) || n < 0) throw new TypeError(`--${name} must be a non-negative integer`);
  return n;
}

/** Parses the command line, runs one activity, returns the exit status. */
export async function main(argv = process.argv.slice(2), log = console.log) {
  let args;
  try {
    const { values } = parseArgs({
      args: argv,
      options: {
        server: { type: 'string', default: '127.0.0.1:50051' },
        tenant: { type: 'string' },
        // A server run with --auth api-keys; default $RETRY_BUDGET_API_KEY.
        'api-key': { type: 'string', default: process.env.RETRY_BUDGET_API_KEY },
        'activity-id': { type: 'string' },
        failures: { type: 'string', default: '2' },
        error: { type: 'string', default: 'transient' },
        dependency: { type: 'string', default: 'flaky-api' },
        'max-attempts': { type: 'string', default: '5' },
        deadline: { type: 'string', default: '60' },
        // Seconds. Base 0 makes every delay the 1 s floor (no jitter), so the
        // example finishes in a few seconds; production policies keep the
        // default base 2 / cap 60 by leaving these out.
        base: { type: 'string', default: '0' },
        cap: { type: 'string', default: '1' },
        help: { type: 'boolean', short: 'h' },
      },
    });
    if (values.help) {
      log(USAGE);
      return 0;
    }
    if (!['transient', 'permanent'].includes(values.error)) throw new TypeError('--error must be transient or permanent');
    args = {
      server: values.server,
      tenant: values.tenant,
      apiKey: values['api-key'],
      activityId: values['activity-id'] ?? `example-${randomUUID().slice(0, 12)}`,
      failures: integer(values, 'failures'),
      ErrorType: values.error === 'transient' ? TransientError : PermanentError,
      dependency: validateDependency(values.dependency),
      policy: {
        max_attempts: integer(values, 'max-attempts'),
        deadline_seconds: integer(values, 'deadline'),
        base: integer(values, 'base'),
        cap: integer(values, 'cap'),
      },
    };
  } catch (err) {
    console.error(`${err.message}\n${USAGE}`);
    return 2;
  }

  const dependency = new FlakyDependency(args.failures, args.ErrorType, args.dependency);
  log(`activity ${args.activityId}, policy ${JSON.stringify(args.policy)}, dependency fails ${args.failures} time(s)`);
  const client = new RetryBudgetClient(args.server, { tenant: args.tenant, apiKey: args.apiKey });
  let code;
  try {
    code = await runActivity(client, args.activityId, dependency, args.policy, log);
  } catch (err) {
    if (!(err instanceof RetryBudgetError)) throw err;
    const code = err.stableCode ? ` (code ${err.stableCode})` : '';
    console.error(`retry-budget call failed: ${err.grpcStatus} ${err.details}${code}`);
    return 2;
  } finally {
    await client.close(); // sends the traffic counts left
  }
  log(`done: ${code} after ${dependency.calls} call(s) to the dependency`);
  return code === 'succeeded' ? 0 : 1;
}

if (process.argv[1] && import.meta.url === pathToFileURL(process.argv[1]).href) {
  process.exitCode = await main();
}
