// A small Node.js client for the retry-budget service (retrybudget.v1).
//
// Copy this file next to your worker with `@grpc/grpc-js` and
// `@grpc/proto-loader` (see package.json) and the repository's `proto/`
// directory. The .proto is loaded at run time, so the client cannot drift
// from the service's contract; nothing is generated or built.
//
// Where the protos are looked up, first match wins:
//   1. the environment variable RETRY_BUDGET_PROTO_DIR;
//   2. ../../proto relative to this file (its place in the repository);
//   3. ./proto next to this file (where `npm pack` copies it, so an
//      installed tarball carries its protos).
//
//     import { RetryBudgetClient } from './retry_budget_client.js';
//     const rb = new RetryBudgetClient('127.0.0.1:50051', { tenant: 'acme' });
//     const d = await rb.nextAction({
//       activity_id: 'charge-42', attempt: 1, error_class: 'transient',
//       policy: { max_attempts: 5, deadline_seconds: 600 }, occurred_at: new Date(),
//     });
//     if (d.code === 'schedule_retry') { /* wait until d.not_before, run attempt 2 */ }
//
// `rb.traffic` (traffic.js) counts the worker's calls to each dependency
// and sends the counts by itself about once a second: the service paces
// each dependency's retries by its successes, which only the worker sees.
//
// Conventions (the README explains why):
// - requests and responses are plain objects whose field names are the
//   proto's, snake_case (`activity_id`, `not_before`);
// - 64-bit integers come back as `bigint` and go out as `bigint`, a decimal
//   string, or a `number` that is a safe integer;
// - enums come back as their full names (`ACTION_SCHEDULE_RETRY`) and go out
//   as full names, short names (`transient`) or numbers;
// - Timestamps come back as `Date` (or `null` when absent) and go out from a
//   `Date` or `{ seconds, nanos }`;
// - a request with a field the proto does not have, or an integer out of its
//   type's range, throws before anything is sent, instead of being dropped
//   or wrapped silently;
// - a failed call rejects with a RetryBudgetError carrying the gRPC code, the
//   stable code that starts the message, and the server's retry pushback.

import { existsSync } from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

import grpc from '@grpc/grpc-js';
import protoLoader from '@grpc/proto-loader';

import { DEFAULT_TRAFFIC_INTERVAL_MS, TrafficReporter } from './traffic.js';

const HERE = path.dirname(fileURLToPath(import.meta.url));
const PROTO_FILE = 'retrybudget/v1/retry_budget.proto';
const PACKAGE = 'retrybudget.v1';
const TIMESTAMP = 'google.protobuf.Timestamp';

/** The metadata key that names the tenant of a durable call. */
export const TENANT_HEADER = 'x-tenant-id';

/** The trailer a server sets to say when to retry (gRFC A6). */
export const RETRY_PUSHBACK_TRAILER = 'grpc-retry-pushback-ms';

/** How long a call may take when the caller does not say (milliseconds). */
export const DEFAULT_DEADLINE_MS = 10_000;

/**
 * Action codes that end (or park) an activity: a worker stops on any of
 * them. `schedule_retry` and `deferred` are the two that continue.
 */
export const TERMINAL_CODES = new Set([
  'attempts_exhausted',
  'deadline_exceeded',
  'fail_permanent',
  'manual_review',
]);

/**
 * The options given to proto-loader. Each one changes the shape of every
 * object this client sends and receives; the README says why each is set.
 */
export const LOADER_OPTIONS = Object.freeze({
  // Field names exactly as in the .proto (activity_id, not activityId), the
  // names the API docs, grpcurl's -d requests and the Python client use.
  keepCase: true,
  // uint64/int64 decoded as decimal strings: exact beyond 2^53, where
  // `Number` would round. This client turns them into `bigint`.
  longs: String,
  // Enums decoded as their names ('ACTION_DEFERRED'), not numbers.
  enums: String,
  // Absent scalars decoded as their proto3 defaults (false, 0, ''), absent
  // messages as null, absent repeated fields as []. `optional` fields stay
  // absent when unset: that is how their presence shows.
  defaults: true,
  // A set oneof member is named by a virtual field; here the only oneofs are
  // the synthetic ones of `optional` fields (`_base: 'base'`), which this
  // client leaves out of its results.
  oneofs: true,
});

/** The directory that holds retrybudget/v1/*.proto. */
export function protoDir() {
  const candidates = [];
  if (process.env.RETRY_BUDGET_PROTO_DIR) candidates.push(process.env.RETRY_BUDGET_PROTO_DIR);
  candidates.push(path.join(HERE, '..', '..', 'proto'));
  candidates.push(path.join(HERE, 'proto'));
  for (const dir of candidates) {
    if (existsSync(path.join(dir, PROTO_FILE))) return path.resolve(dir);
  }
  throw new Error(
    `retry_budget_client: cannot find ${PROTO_FILE}; set RETRY_BUDGET_PROTO_DIR to the ` +
      `retry-budget repository's proto/ directory (looked in ${candidates.join(', ')})`,
  );
}

/**
 * The loaded package definition. `includeDirs` resolves the proto's own
 * import (retrybudget/v1/error_detail.proto); google/protobuf/timestamp.proto
 * and duration.proto are bundled with protobufjs and need no include dir.
 */
export const packageDefinition = protoLoader.loadSync(PROTO_FILE, {
  ...LOADER_OPTIONS,
  includeDirs: [protoDir()],
});

const proto = grpc.loadPackageDefinition(packageDefinition);
const ServiceClient = proto.retrybudget.v1.RetryBudget;

// ---------------------------------------------------------------------------
// Timestamps

/**
 * A `Date` as a google.protobuf.Timestamp. Pass this, never the `Date`
 * itself: proto-loader reads `.seconds` and `.nanos` off whatever it is
 * given, finds neither on a Date, and sends an all-zero Timestamp, which
 * the service reads as 1970-01-01T00:00:00Z.
 *
 * Accepts a `Date` or an object that already has `seconds` (and `nanos`).
 * Throws a TypeError for anything else, an invalid Date included.
 */
export function toTimestamp(value, where = 'toTimestamp') {
  if (value instanceof Date) {
    const ms = value.getTime();
    if (!Number.isFinite(ms)) throw new TypeError(`${where}: invalid Date`);
    // Floor, so that a time before 1970 keeps nanos in [0, 1e9).
    const seconds = Math.floor(ms / 1000);
    return { seconds, nanos: (ms - seconds * 1000) * 1_000_000 };
  }
  if (value !== null && typeof value === 'object' && 'seconds' in value) {
    const nanos = value.nanos ?? 0;
    if (!Number.isInteger(nanos) || nanos < 0 || nanos > 999_999_999) {
      throw new RangeError(`${where}: nanos must be an integer in [0, 999999999], got ${nanos}`);
    }
    return { seconds: value.seconds, nanos };
  }
  throw new TypeError(`${where}: expected a Date or {seconds, nanos}, got ${describe(value)}`);
}

/**
 * A decoded google.protobuf.Timestamp as a `Date` (null when absent).
 * A Date holds milliseconds: nanoseconds below the millisecond are dropped.
 */
export function fromTimestamp(ts) {
  if (ts === null || ts === undefined) return null;
  return new Date(Number(ts.seconds) * 1000 + Math.floor((ts.nanos ?? 0) / 1_000_000));
}

// ---------------------------------------------------------------------------
// Requests and responses: plain objects checked and converted by the proto's
// own descriptors, so one rule covers every message.

const INT64_TYPES = new Set(['TYPE_INT64', 'TYPE_UINT64', 'TYPE_SINT64', 'TYPE_FIXED64', 'TYPE_SFIXED64']);
const UNSIGNED_64 = new Set(['TYPE_UINT64', 'TYPE_FIXED64']);
const INT32_RANGES = {
  TYPE_UINT32: [0, 2 ** 32 - 1],
  TYPE_FIXED32: [0, 2 ** 32 - 1],
  TYPE_INT32: [-(2 ** 31), 2 ** 31 - 1],
  TYPE_SINT32: [-(2 ** 31), 2 ** 31 - 1],
  TYPE_SFIXED32: [-(2 ** 31), 2 ** 31 - 1],
};
const UINT64_MAX = 2n ** 64n - 1n;
const INT64_MIN = -(2n ** 63n);
const INT64_MAX = 2n ** 63n - 1n;

function describe(value) {
  if (value === null) return 'null';
  if (value instanceof Date) return 'a Date';
  return typeof value === 'object' ? value.constructor?.name ?? 'an object' : `${typeof value} ${value}`;
}

// The full name of a field's message or enum type (descriptors name types of
// the same package relatively).
function typeNameOf(field) {
  const name = field.typeName.replace(/^\./, '');
  if (packageDefinition[name]) return name;
  return `${PACKAGE}.${name}`;
}

function definitionOf(fullName) {
  const def = packageDefinition[fullName];
  if (!def) throw new Error(`retry_budget_client: type ${fullName} is not in the loaded proto`);
  return def;
}

function enumValue(fullName, field, value) {
  const values = definitionOf(fullName).type.value;
  if (typeof value === 'number') {
    if (values.some((v) => v.number === value)) return value;
  } else if (typeof value === 'string') {
    // Every enum of this API has a <PREFIX>_UNSPECIFIED = 0: the prefix lets
    // callers write 'transient' for ERROR_CLASS_TRANSIENT.
    const unspecified = values.find((v) => v.number === 0).name;
    const prefix = unspecified.slice(0, -'UNSPECIFIED'.length);
    const upper = value.trim().toUpperCase();
    for (const candidate of [upper, prefix + upper]) {
      if (values.some((v) => v.name === candidate)) return candidate;
    }
  }
  const names = values.map((v) => v.name).join(', ');
  throw new TypeError(`${field}: ${describe(value)} is not a value of ${fullName} (${names})`);
}

function int64Value(type, field, value) {
  let big;
  if (typeof value === 'bigint') big = value;
  else if (typeof value === 'string' && /^-?\d+$/.test(value.trim())) big = BigInt(value.trim());
  else if (typeof value === 'number') {
    // A number past 2^53 was rounded before it got here: refuse it rather
    // than send a value the caller did not write.
    if (!Number.isSafeInteger(value)) {
      throw new RangeError(`${field}: ${value} is not a safe integer; pass a bigint or a decimal string`);
    }
    big = BigInt(value);
  } else {
    throw new TypeError(`${field}: expected a bigint, a decimal string or an integer, got ${describe(value)}`);
  }
  const [min, max] = UNSIGNED_64.has(type) ? [0n, UINT64_MAX] : [INT64_MIN, INT64_MAX];
  if (big < min || big > max) throw new RangeError(`${field}: ${big} is out of range for ${type}`);
  return big.toString();
}

function scalarValue(type, field, value) {
  if (INT64_TYPES.has(type)) return int64Value(type, field, value);
  const range = INT32_RANGES[type];
  if (range) {
    if (!Number.isInteger(value) || value < range[0] || value > range[1]) {
      throw new RangeError(`${field}: expected an integer in [${range[0]}, ${range[1]}], got ${describe(value)}`);
    }
    return value;
  }
  if (type === 'TYPE_STRING' && typeof value !== 'string') {
    throw new TypeError(`${field}: expected a string, got ${describe(value)}`);
  }
  if (type === 'TYPE_BOOL' && typeof value !== 'boolean') {
    throw new TypeError(`${field}: expected a boolean, got ${describe(value)}`);
  }
  return value;
}

function encodeField(field, value, name) {
  if (field.type === 'TYPE_MESSAGE') {
    const fullName = typeNameOf(field);
    const message = fullName === TIMESTAMP ? toTimestamp(value, name) : value;
    return encodeMessage(fullName, message, name);
  }
  if (field.type === 'TYPE_ENUM') return enumValue(typeNameOf(field), name, value);
  return scalarValue(field.type, name, value);
}

/**
 * A plain request object, checked against the proto and shaped for
 * proto-loader. Throws a TypeError or RangeError naming the field at fault.
 */
export function encodeMessage(fullName, value, where = fullName) {
  if (value === null || typeof value !== 'object' || Array.isArray(value) || value instanceof Date) {
    throw new TypeError(`${where}: expected a plain object for ${fullName}, got ${describe(value)}`);
  }
  const fields = new Map(definitionOf(fullName).type.field.map((f) => [f.name, f]));
  const out = {};
  for (const [key, v] of Object.entries(value)) {
    const field = fields.get(key);
    if (!field) {
      const known = [...fields.keys()].join(', ');
      throw new TypeError(
        `${where}: ${fullName} has no field ${key} (field names are the proto's, snake_case: ${known})`,
      );
    }
    if (v === undefined || v === null) continue; // absent
    if (field.label === 'LABEL_REPEATED') {
      if (!Array.isArray(v)) throw new TypeError(`${where}.${key}: expected an array, got ${describe(v)}`);
      out[key] = v.map((item, i) => encodeField(field, item, `${where}.${key}[${i}]`));
    } else {
      out[key] = encodeField(field, v, `${where}.${key}`);
    }
  }
  return out;
}

function decodeField(field, value) {
  if (field.type === 'TYPE_MESSAGE') {
    const fullName = typeNameOf(field);
    if (fullName === TIMESTAMP) return fromTimestamp(value);
    return decodeMessage(fullName, value);
  }
  if (INT64_TYPES.has(field.type)) return BigInt(value);
  return value;
}

/**
 * A decoded response as a plain object: Timestamps as Date (or null), 64-bit
 * integers as bigint, enums as names, absent `optional` fields left out.
 */
export function decodeMessage(fullName, value) {
  if (value === null || value === undefined) return null;
  const out = {};
  for (const field of definitionOf(fullName).type.field) {
    const v = value[field.name];
    if (v === undefined) continue; // an unset `optional` field
    out[field.name] =
      field.label === 'LABEL_REPEATED' ? v.map((item) => decodeField(field, item)) : decodeField(field, v);
  }
  return out;
}

// ---------------------------------------------------------------------------
// Errors

/**
 * The stable snake_case code that starts a service error's message
 * ("attempt_out_of_order: ..."), or null when the message has none (an
 * error made by the client library itself, such as a missed deadline).
 */
export function stableCodeOf(message) {
  const m = /^([a-z][a-z0-9_]*): /.exec(message ?? '');
  return m ? m[1] : null;
}

/**
 * The grpc-retry-pushback-ms trailer of a failed call, as gRFC A6 reads it:
 * a non-negative number of milliseconds to wait; -1 when the trailer is
 * present but not an integer (A6: do not retry); null when absent.
 */
export function retryPushbackMs(metadata) {
  const values = metadata?.get?.(RETRY_PUSHBACK_TRAILER) ?? [];
  if (values.length === 0) return null;
  const raw = String(values[0]).trim();
  if (!/^-?\d+$/.test(raw)) return -1;
  const ms = Number(raw);
  return ms < 0 ? -1 : Math.min(ms, Number.MAX_SAFE_INTEGER);
}

/** The trailer holding a refusal's google.rpc.Status, encoded. */
const STATUS_DETAILS_TRAILER = 'grpc-status-details-bin';
const ERROR_INFO_TYPE = 'type.googleapis.com/google.rpc.ErrorInfo';

/**
 * The fields of an encoded protobuf message, as [number, value] pairs: a
 * varint as a BigInt, a length-delimited field as its bytes (fixed-width
 * ones are skipped). Enough to read google.rpc.Status without its schema.
 */
function* protobufFields(bytes) {
  let at = 0;
  const varint = () => {
    let value = 0n;
    for (let shift = 0n; ; shift += 7n) {
      if (at >= bytes.length) throw new RangeError('truncated varint');
      const byte = bytes[at++];
      value |= BigInt(byte & 0x7f) << shift;
      if (byte < 0x80) return value;
    }
  };
  while (at < bytes.length) {
    const key = Number(varint());
    const wire = key & 7;
    if (wire === 0) yield [key >>> 3, varint()];
    else if (wire === 2) {
      const len = Number(varint());
      if (at + len > bytes.length) throw new RangeError('truncated field');
      yield [key >>> 3, bytes.subarray(at, at + len)];
      at += len;
    } else if (wire === 1) at += 8;
    else if (wire === 5) at += 4;
    else throw new RangeError(`unsupported wire type ${wire}`);
  }
}

/**
 * The google.rpc.ErrorInfo of a refusal, from its grpc-status-details-bin
 * trailer: `{ reason, domain, metadata }`, where reason is the stable code,
 * domain 'retrybudget.v1', and metadata the values involved ({ field:
 * 'attempt', expected: '2', got: '3' }). null when the trailer has none.
 */
export function errorInfo(metadata) {
  const raw = metadata?.get?.(STATUS_DETAILS_TRAILER)?.[0];
  if (!raw) return null;
  const text = (bytes) => Buffer.from(bytes).toString('utf8');
  try {
    for (const [number, any] of protobufFields(Buffer.from(raw))) {
      if (number !== 3) continue; // google.rpc.Status.details
      let type = '';
      let value = null;
      for (const [n, v] of protobufFields(any)) {
        if (n === 1) type = text(v);
        else if (n === 2) value = v;
      }
      if (type !== ERROR_INFO_TYPE || value === null) continue;
      const info = { reason: '', domain: '', metadata: {} };
      for (const [n, v] of protobufFields(value)) {
        if (n === 1) info.reason = text(v);
        else if (n === 2) info.domain = text(v);
        else if (n === 3) {
          let key = '';
          let entry = '';
          for (const [m, x] of protobufFields(v)) {
            if (m === 1) key = text(x);
            else if (m === 2) entry = text(x);
          }
          info.metadata[key] = entry;
        }
      }
      return info;
    }
  } catch {
    return null; // not a google.rpc.Status: no ErrorInfo to read
  }
  return null;
}

/** The name of a numeric gRPC status code ('FAILED_PRECONDITION'). */
export function statusName(code) {
  return grpc.status[code] ?? `CODE_${code}`;
}

/** A failed call to retry-budget. */
export class RetryBudgetError extends Error {
  constructor(serviceError, method) {
    const details = serviceError.details ?? serviceError.message ?? '';
    super(`${method}: ${statusName(serviceError.code)}: ${details}`, { cause: serviceError });
    this.name = 'RetryBudgetError';
    /** The RPC that failed ('NextAction'). */
    this.method = method;
    /** The numeric gRPC status code, as grpc-js reports it (grpc.status.*). */
    this.code = serviceError.code;
    /** Its name: 'INVALID_ARGUMENT', 'FAILED_PRECONDITION', 'NOT_FOUND', ... */
    this.grpcStatus = statusName(serviceError.code);
    /** The service's message: the stable code, ': ', an explanation. */
    this.details = details;
    /** The stable code ('attempt_out_of_order'): match on this, never on the message. */
    this.stableCode = stableCodeOf(details);
    /** google.rpc.ErrorInfo: { reason, domain, metadata } with the values involved; null if absent. */
    this.errorInfo = errorInfo(serviceError.metadata);
    /** Milliseconds the server asked to wait before calling again (A6); null if it did not say. */
    this.retryPushbackMs = retryPushbackMs(serviceError.metadata);
    /** The response trailers. */
    this.metadata = serviceError.metadata;
  }
}

/**
 * An ErrorDetail (the `error` field of a NextAction report) for a failed
 * gRPC call your worker made to one of its own dependencies: its status code
 * and its grpc-retry-pushback-ms trailer, so the service classifies the
 * failure and plans with the pushback. Add `safety` (and `reached`) yourself:
 * only you know whether the operation is safe to repeat.
 */
export function grpcErrorDetail(serviceError) {
  const detail = { grpc_code: serviceError.code };
  const pushback = retryPushbackMs(serviceError.metadata);
  if (pushback !== null) detail.grpc_retry_pushback_ms = pushback;
  return detail;
}

// ---------------------------------------------------------------------------
// The client

/** A client of one retry-budget server, for one tenant. */
export class RetryBudgetClient {
  /**
   * @param {string} address host:port of the server ('127.0.0.1:50051').
   * @param {object} [options]
   * @param {string} [options.tenant] sent as x-tenant-id on every call; absent means "default".
   * @param {string} [options.apiKey] sent as `authorization: Bearer <key>` to a server run with
   *   `--auth api-keys`; the tenant is then the key's (leave `tenant` out, or name the same one).
   * @param {number} [options.deadlineMs] how long each call may take (default 10 s).
   * @param {grpc.ChannelCredentials} [options.credentials] default: plaintext.
   * @param {object} [options.channelOptions] grpc-js channel options.
   * @param {number | null} [options.trafficIntervalMs] how often `traffic` sends the calls counted
   *   (ReportTraffic), default 1000; null turns counting off.
   * @param {{info: Function, warn: Function, error: Function}} [options.logger] where `traffic`
   *   says that reports fail; default: console.
   */
  constructor(
    address,
    {
      tenant, apiKey, deadlineMs = DEFAULT_DEADLINE_MS, credentials, channelOptions,
      trafficIntervalMs = DEFAULT_TRAFFIC_INTERVAL_MS, logger = console,
    } = {},
  ) {
    this.address = address;
    this.tenant = tenant ?? null;
    this.apiKey = apiKey ?? null;
    this.deadlineMs = deadlineMs;
    this.stub = new ServiceClient(address, credentials ?? grpc.credentials.createInsecure(), channelOptions);
    /** Counts calls per dependency and sends them (ReportTraffic): see traffic.js. */
    this.traffic = new TrafficReporter(this, { intervalMs: trafficIntervalMs, logger });
  }

  /**
   * Sends the traffic counts left, then closes the channel. The returned
   * promise never rejects; with nothing left to send the channel is closed
   * at once.
   */
  close() {
    if (this.traffic.counts.size === 0 && !this.traffic.sending) {
      this.traffic.close();
      this.stub.close();
      return Promise.resolve();
    }
    return this.traffic.close().then(() => this.stub.close());
  }

  /**
   * Counts one call to `dependency` for the next traffic report
   * (`TrafficReporter.recordCall`).
   */
  recordCall(dependency, ok, options) {
    this.traffic.recordCall(dependency, ok, options);
  }

  /**
   * Calls one RPC: checks and converts the request, sets the tenant and the
   * deadline, and converts the response or the error. Async, so a request
   * refused by the checks rejects like a failed call instead of throwing.
   */
  async call(method, requestType, responseType, request, { deadlineMs } = {}) {
    const message = encodeMessage(`${PACKAGE}.${requestType}`, request ?? {});
    const metadata = new grpc.Metadata();
    if (this.tenant) metadata.set(TENANT_HEADER, this.tenant);
    if (this.apiKey) metadata.set('authorization', `Bearer ${this.apiKey}`);
    const deadline = Date.now() + (deadlineMs ?? this.deadlineMs);
    return new Promise((resolve, reject) => {
      this.stub[method](message, metadata, { deadline }, (err, response) => {
        if (err) reject(new RetryBudgetError(err, method));
        else resolve(decodeMessage(`${PACKAGE}.${responseType}`, response));
      });
    });
  }

  /**
   * RetryDelay: the backoff of one attempt, `{ delay_seconds, delay_ms }`.
   * Pure: nothing is stored. Request: `{ activity_id, attempt, base?, cap? }`.
   */
  retryDelay(request, options) {
    return this.call('RetryDelay', 'RetryDelayRequest', 'RetryDelayResponse', request, options);
  }

  /**
   * NextAction: what to do after a failed attempt.
   *
   * Durable form (no `budget`): `{ activity_id, attempt, error_class or
   * error, policy?, occurred_at?, workflow_id?, dependency?, dry_run? }`;
   * the service counts attempts and records the decision before it
   * replies. Pure form: `{ budget: { attempts, max_attempts, elapsed,
   * deadline }, error_class, activity_id?, dependency? }`; nothing is
   * stored. `dependency` names what the failed call went to
   * ('payments-api'; '' is the default one): a retry takes a token of its
   * budget.
   */
  nextAction(request, options) {
    return this.call('NextAction', 'NextActionRequest', 'NextActionResponse', request, options);
  }

  /**
   * RecordSuccess: closes the activity, idempotently.
   * Request: `{ activity_id, occurred_at?, dependency? }`; response `{ status, changed }`.
   * The service counts every RecordSuccess as one success of `dependency`
   * ('' is the default one): count that call with `recordCall(dependency,
   * true, { successRecorded: true })`, or its success is counted twice.
   */
  recordSuccess(request, options) {
    return this.call('RecordSuccess', 'RecordSuccessRequest', 'RecordSuccessResponse', request, options);
  }

  /**
   * ResolveActivity: a reviewer's decision on an activity parked for manual
   * review. Request: `{ activity_id, resolution: 'fail' | 'retry', note? }`.
   */
  resolveActivity(request, options) {
    return this.call('ResolveActivity', 'ResolveActivityRequest', 'ResolveActivityResponse', request, options);
  }

  /**
   * ReportTraffic: `{ dependencies: [{ dependency, calls, successes, failures }] }`
   * since the last report, answered with each one's pace `{ dependencies:
   * [{ dependency, allowed_rate, earned_rate, success_rate, state,
   * explanation, ... }] }`, as the calling tenant sees it. An empty request
   * reads the pace of every dependency the calling tenant used (never
   * another tenant's). `traffic` sends these by itself; call this to read
   * the paces.
   */
  reportTraffic(request, options) {
    return this.call('ReportTraffic', 'ReportTrafficRequest', 'ReportTrafficResponse', request, options);
  }

  /**
   * GetActivity: the activity's budget and every recorded decision.
   * Request: `{ activity_id }`. Rejects with NOT_FOUND for an unknown one.
   */
  getActivity(request, options) {
    return this.call('GetActivity', 'GetActivityRequest', 'Activity', request, options);
  }
}

export { grpc };
export { TrafficReporter, validateDependency } from './traffic.js';
