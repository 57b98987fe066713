// Traffic counts: how a worker's calls to each dependency went, sent to the
// service by themselves about once a second.
//
// The service paces each dependency's retries by what it sees of it (the
// failures it is asked about with every NextAction, and whether the retries
// it grants fail): 20 retries a second to start with, cut to a floor of
// probes in trouble (spaced out while it lasts), grown back while retries do
// not fail. The successes a worker reports add to that, for its tenant
// alone: a tenth of them a second (`ReportTraffic` in the proto). Failures
// reach the service on their own; successes do not. A worker that never
// tells them earns its tenant nothing on top of the shared allowance, so
// the client counts its calls in memory and a timer sends the sums since
// the previous report, one ReportTraffic an interval.
//
//     const rb = new RetryBudgetClient('127.0.0.1:50051', { tenant: 'acme' });   // rb.traffic counts
//     const receipt = await rb.traffic.call('payments-api', () => charge(card)); // a success unless it throws
//     rb.traffic.recordCall('mail-relay', false);                                // or say it yourself
//     await rb.close();                                                          // sends what is left
//
// A send that fails keeps its counts for the next one and is logged (once
// while the service stays away), never thrown: counting must not be what
// breaks a worker. Memory is bounded: at most `maxDependencies` names wait
// to be sent, and a count saturates at the proto's uint64. The timer is
// unref'd: it never keeps a process alive by itself.

/** How often counts are sent by default: the service counts successes in one-second slots. */
export const DEFAULT_TRAFFIC_INTERVAL_MS = 1000;

/**
 * How long one report may take: a report held longer than a couple of
 * intervals is stale anyway, and close() must not hold a worker's shutdown
 * for the client's own 10 s.
 */
export const DEFAULT_TRAFFIC_DEADLINE_MS = 2000;

/** Dependency names waiting to be sent at most (the service tracks 64 one by one by default). */
export const DEFAULT_MAX_DEPENDENCIES = 256;

/** The service's bound on a dependency name (`invalid_dependency`). */
export const MAX_DEPENDENCY_BYTES = 64;

const UINT64_MAX = 2n ** 64n - 1n;
const PRINTABLE_NO_SPACE = /^[\x21-\x7e]*$/;

/**
 * `dependency` if the service accepts it as a name: up to 64 printable
 * ASCII characters without spaces, or '' for the default dependency.
 * Throws a TypeError otherwise, here rather than later: one bad name in a
 * batch would make the service refuse the whole report.
 */
export function validateDependency(dependency) {
  if (typeof dependency !== 'string') {
    throw new TypeError(`dependency must be a string, got ${dependency === null ? 'null' : typeof dependency}`);
  }
  if (dependency.length > MAX_DEPENDENCY_BYTES || !PRINTABLE_NO_SPACE.test(dependency)) {
    throw new TypeError(
      `dependency ${JSON.stringify(dependency)}: up to ${MAX_DEPENDENCY_BYTES} printable ASCII characters ` +
        'without spaces (the service refuses it with invalid_dependency)',
    );
  }
  return dependency;
}

const add = (a, b) => {
  const sum = a + BigInt(b);
  return sum > UINT64_MAX ? UINT64_MAX : sum;
};

// Reporters not closed that hold counts when the event loop empties: each
// sends once more ('beforeExit'), since the timer is unref'd and an
// integration's client lives as long as the process.
const open = new Set();
let exitHookSet = false;
function sendAtExit() {
  for (const reporter of open) {
    if (reporter.exitFlushed || reporter.counts.size === 0) continue;
    // Once: a send that fails at exit keeps its counts, which must not
    // bring 'beforeExit' back forever.
    reporter.exitFlushed = true;
    reporter.flush();
  }
}

/**
 * Counts calls, successes and failures per dependency, and sends them with
 * one ReportTraffic every `intervalMs` from an unref'd timer.
 *
 * `intervalMs: null` (or 0) turns counting off: every count is ignored and
 * nothing is sent.
 */
export class TrafficReporter {
  /**
   * @param {{ reportTraffic: Function, address?: string }} client what sends the reports.
   * @param {object} [options]
   * @param {number | null} [options.intervalMs] between reports (default 1000); null or 0: off.
   * @param {number} [options.deadlineMs] how long one report may take (default 2000).
   * @param {number} [options.maxDependencies] names waiting to be sent at most (default 256).
   * @param {{info: Function, warn: Function, error: Function}} [options.logger] default: console.
   */
  constructor(
    client,
    {
      intervalMs = DEFAULT_TRAFFIC_INTERVAL_MS,
      deadlineMs = DEFAULT_TRAFFIC_DEADLINE_MS,
      maxDependencies = DEFAULT_MAX_DEPENDENCIES,
      logger = console,
    } = {},
  ) {
    if (intervalMs !== null && intervalMs !== 0 && !(Number.isFinite(intervalMs) && intervalMs > 0)) {
      throw new RangeError(`traffic intervalMs must be a positive number of milliseconds, or null (off), got ${intervalMs}`);
    }
    this.client = client;
    /** Milliseconds between reports; null when counting is off. */
    this.intervalMs = intervalMs || null;
    this.deadlineMs = deadlineMs;
    this.maxDependencies = maxDependencies;
    this.logger = logger;
    /** Each dependency's pace, as the last report that got through answered it. */
    this.paces = new Map();
    /** Calls not counted: to names past maxDependencies, or in a report the service refused as invalid. */
    this.dropped = 0;
    /** dependency -> [calls, successes, failures] not sent yet, as bigints. */
    this.counts = new Map();
    this.timer = null;
    this.sending = null;
    this.closed = false;
    this.failing = false;
    this.saidFull = false;
    this.exitFlushed = false;
  }

  /** Whether counts are kept and sent (an interval is set). */
  get enabled() {
    return this.intervalMs !== null;
  }

  /**
   * Counts one call to `dependency` ('' is the default one).
   *
   * `successRecorded: true` for a success also sent with
   * `RecordSuccess({ dependency })`: the service counts each of those as a
   * success of its dependency, so only the call is counted here and the
   * success is not counted twice.
   */
  recordCall(dependency, ok, { successRecorded = false } = {}) {
    validateDependency(dependency);
    if (ok) this.count(dependency, 1, successRecorded ? 0 : 1, 0);
    else this.count(dependency, 1, 0, 1);
  }

  count(dependency, calls, successes, failures) {
    if (!this.enabled || this.closed) return;
    if (!this.merge(dependency, calls, successes, failures)) {
      this.drop(dependency);
      return;
    }
    this.start();
  }

  /** Adds counts to `name`'s; false, counting nothing, when `name` is new and the bound is reached. */
  merge(name, calls, successes, failures) {
    let c = this.counts.get(name);
    if (!c) {
      if (this.counts.size >= this.maxDependencies) return false;
      c = [0n, 0n, 0n];
      this.counts.set(name, c);
    }
    c[0] = add(c[0], calls);
    c[1] = add(c[1], successes);
    c[2] = add(c[2], failures);
    return true;
  }

  drop(dependency) {
    this.dropped += 1;
    if (!this.saidFull) {
      this.saidFull = true;
      this.logger.warn(`retry-budget traffic: ${this.counts.size} dependencies already wait to be sent; calls to ` +
        `${JSON.stringify(dependency)} and other new names are not counted until the next report ` +
        `(maxDependencies=${this.maxDependencies})`);
    }
  }

  start() {
    if (this.timer) return;
    this.timer = setInterval(() => {
      // A report still on its way: the next tick sends what came since.
      if (!this.sending) this.flush();
    }, this.intervalMs);
    this.timer.unref();
    open.add(this);
    if (!exitHookSet) {
      exitHookSet = true;
      process.on('beforeExit', sendAtExit);
    }
  }

  /**
   * Runs `fn` as one call to `dependency` and counts it: a success when it
   * returns (or its promise resolves), a failure when it throws (or
   * rejects); the result or the error goes on to the caller unchanged.
   */
  async call(dependency, fn) {
    validateDependency(dependency);
    let result;
    try {
      result = await fn();
    } catch (err) {
      this.recordCall(dependency, false);
      throw err;
    }
    this.recordCall(dependency, true);
    return result;
  }

  /** `fn` wrapped so that every call of it is a call to `dependency`, counted as `call()` does. */
  wrap(dependency, fn) {
    validateDependency(dependency);
    const reporter = this;
    return async function counted(...args) {
      return reporter.call(dependency, () => fn.apply(this, args));
    };
  }

  /** The counts not sent yet: { dependency: { calls, successes, failures } } as bigints. */
  pending() {
    const out = {};
    for (const [name, [calls, successes, failures]] of this.counts) out[name] = { calls, successes, failures };
    return out;
  }

  /**
   * Sends the counts now. Resolves to the service's answer, or null when
   * there was nothing to send or the send failed (its counts are then kept
   * for the next one). Never rejects.
   */
  flush() {
    const previous = this.sending ?? Promise.resolve();
    // One report at a time, in order: a flush while one is on its way
    // sends after it, what was counted since.
    const next = previous.then(() => this.send());
    this.sending = next;
    next.finally(() => {
      if (this.sending === next) this.sending = null;
    });
    return next;
  }

  async send() {
    if (this.counts.size === 0) return null;
    const batch = this.counts;
    this.counts = new Map();
    this.saidFull = false;
    const request = {
      dependencies: [...batch].map(([dependency, [calls, successes, failures]]) => ({
        dependency, calls, successes, failures,
      })),
    };
    let response;
    try {
      response = await this.client.reportTraffic(request, { deadlineMs: this.deadlineMs });
    } catch (err) {
      // Whatever it was (the service away, a bug of ours), the worker's
      // own code must not see it.
      this.failed(batch, err);
      return null;
    }
    if (this.failing) {
      this.failing = false;
      this.logger.info(`retry-budget traffic: reports reach ${this.client.address} again`);
    }
    for (const pace of response.dependencies) this.paces.set(pace.dependency, pace);
    return response;
  }

  failed(batch, err) {
    if (err?.grpcStatus === 'INVALID_ARGUMENT') {
      // The service will refuse this batch however often it is sent:
      // sending it again would block every later count behind it.
      for (const [calls] of batch.values()) this.dropped += Number(calls);
      this.logger.error(`retry-budget traffic: the service refused a report (${err.grpcStatus}: ${err.details}); ` +
        'its counts are dropped');
      return;
    }
    this.keep(batch);
    if (!this.failing) {
      this.failing = true;
      this.logger.warn(`retry-budget traffic: reports cannot reach ${this.client.address} ` +
        `(${err?.grpcStatus ?? err?.name}: ${err?.details ?? err?.message}); counts are kept and sent when it answers`);
    }
  }

  /** Puts a batch that was not sent back with what was counted since, within the bound. */
  keep(batch) {
    for (const [name, [calls, successes, failures]] of batch) {
      if (!this.merge(name, calls, successes, failures)) this.dropped += Number(calls);
    }
  }

  /** Stops the timer and sends what is left, once. Never rejects. */
  async close() {
    if (this.closed) return;
    this.closed = true;
    clearInterval(this.timer);
    this.timer = null;
    open.delete(this);
    await this.flush();
  }
}
