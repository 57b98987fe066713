// Starts the real retry-budget binary for the tests: on 127.0.0.1:0 (the
// kernel picks a free port, so no race for one), with a temporary data dir,
// reading the bound address from its `serving addr=...` log line.
//
// The binary is RETRY_BUDGET_BIN, else ../../target/debug/retry-budget
// relative to this package (what `cargo build` leaves in the repository).
// It lives outside test/ because `node --test` runs every file under a
// directory named test as a test file.

import { spawn } from 'node:child_process';
import { accessSync, constants, mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const PACKAGE_DIR = path.join(path.dirname(fileURLToPath(import.meta.url)), '..');
const REPO = path.join(PACKAGE_DIR, '..', '..');

// The line the server logs once its listener is bound, for example
// `INFO retry_budget::server: serving addr=127.0.0.1:39069 service=...`.
const SERVING = /\bserving addr=(\S+)/;
const START_TIMEOUT_MS = 30_000;

/**
 * Server arguments for tests about the durable and pure forms, whose
 * retries come back to back in one dependency: a static dependency rate at
 * the global one leaves the global bucket alone in charge, as before
 * dependencies had budgets. Under the adaptive default a dependency starts
 * at 20 retries a second and is cut while its granted retries fail
 * (test/traffic.test.js runs that default).
 */
export const GLOBAL_BUDGET_ONLY = Object.freeze(['--dependency-rate', '100']);
const STOP_TIMEOUT_MS = 30_000;

// Servers started and not yet exited: killed if the test process ends
// without stopping them (a failed assertion in a hook, an uncaught error,
// Ctrl-C or the runner's SIGTERM), so no server (or its data dir) outlives
// its test file. An orphaned server would keep running: it never reads the
// pipe that would tell it its parent is gone.
const running = new Map(); // process -> its temporary directory
function killAll() {
  for (const [proc, workdir] of running) {
    proc.kill('SIGKILL');
    rmSync(workdir, { recursive: true, force: true });
  }
  running.clear();
}
process.on('exit', killAll);
for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP']) {
  process.once(signal, () => {
    killAll();
    process.kill(process.pid, signal); // die of the signal, as without this handler
  });
}

/** The server binary the tests run. */
export function binary() {
  const configured = process.env.RETRY_BUDGET_BIN || path.join('target', 'debug', 'retry-budget');
  const bin = path.isAbsolute(configured) ? configured : path.join(REPO, configured);
  try {
    accessSync(bin, constants.X_OK);
  } catch {
    throw new Error(`retry-budget binary not found at ${bin}: run \`cargo build\` first or set RETRY_BUDGET_BIN`);
  }
  return bin;
}

/** A running server; `stop()` ends it and removes its data dir. */
export class Server {
  constructor(proc, address, workdir, lines) {
    this.proc = proc;
    /** host:port it serves on. */
    this.address = address;
    this.workdir = workdir;
    this.lines = lines;
  }

  /** Everything it logged so far. */
  log() {
    return this.lines.join('\n');
  }

  /**
   * SIGTERM, then the exit code (0 for a clean drain). A server that does
   * not exit in time is killed with SIGKILL and the promise rejects.
   */
  async stop() {
    try {
      if (this.proc.exitCode !== null || this.proc.signalCode !== null) return this.proc.exitCode;
      const exited = new Promise((resolve) => this.proc.once('exit', (code, signal) => resolve({ code, signal })));
      this.proc.kill('SIGTERM');
      let timer;
      const timedOut = new Promise((resolve) => {
        timer = setTimeout(() => resolve(null), STOP_TIMEOUT_MS);
      });
      const result = await Promise.race([exited, timedOut]);
      clearTimeout(timer);
      if (result === null) {
        this.proc.kill('SIGKILL');
        await exited;
        throw new Error(`server did not exit within ${STOP_TIMEOUT_MS} ms of SIGTERM:\n${this.log()}`);
      }
      return result.code ?? result.signal;
    } finally {
      rmSync(this.workdir, { recursive: true, force: true });
    }
  }
}

/**
 * Starts the binary with `extraArgs` (e.g. ['--retry-rate', '1']) and
 * resolves once it serves. Rejects with its log if it exits first or does
 * not bind within 30 s.
 */
export function startServer(extraArgs = []) {
  const bin = binary();
  const workdir = mkdtempSync(path.join(tmpdir(), 'retry-budget-node-'));
  const args = ['--listen', '127.0.0.1:0', '--data-dir', path.join(workdir, 'data'), '--drain-delay', '0s', ...extraArgs];
  const proc = spawn(bin, args, {
    cwd: workdir,
    env: { ...process.env, RUST_LOG: 'info', NO_COLOR: '1' },
    stdio: ['ignore', 'pipe', 'pipe'],
  });
  running.set(proc, workdir);
  proc.once('exit', () => running.delete(proc));
  const lines = [];
  return new Promise((resolve, reject) => {
    let settled = false;
    const fail = (why) => {
      if (settled) return;
      settled = true;
      clearTimeout(timer);
      proc.kill('SIGKILL');
      rmSync(workdir, { recursive: true, force: true });
      reject(new Error(`${why}:\n${lines.join('\n')}`));
    };
    const timer = setTimeout(() => fail(`server did not log "serving addr=" within ${START_TIMEOUT_MS} ms`), START_TIMEOUT_MS);
    const onData = (stream) => {
      let partial = '';
      stream.setEncoding('utf8');
      stream.on('data', (chunk) => {
        const parts = (partial + chunk).split('\n');
        partial = parts.pop();
        for (const line of parts) {
          lines.push(line);
          const m = SERVING.exec(line);
          if (m && !settled) {
            settled = true;
            clearTimeout(timer);
            resolve(new Server(proc, m[1], workdir, lines));
          }
        }
      });
    };
    onData(proc.stdout);
    onData(proc.stderr);
    proc.once('error', (err) => fail(`server could not start: ${err.message}`));
    proc.once('exit', (code, signal) => fail(`server exited (${code ?? signal}) before serving`));
  });
}
