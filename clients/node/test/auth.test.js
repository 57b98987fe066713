// A server run with --auth api-keys: the client's apiKey goes as
// `authorization: Bearer <key>`, and the tenant is the key's.

import assert from 'node:assert/strict';
import { createHash, randomBytes } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import path from 'node:path';
import { after, before, test } from 'node:test';

import { RetryBudgetClient } from '../retry_budget_client.js';
import { startServer } from '../testing/server.js';

// A key as `retry-budget keys add` makes them, and the file line the server
// checks it against (only the key's SHA-256 is stored).
const key = `rb_${randomBytes(32).toString('base64url')}`;
const dir = mkdtempSync(path.join(tmpdir(), 'retry-budget-keys-'));
const keysFile = path.join(dir, 'keys');
let server;

before(async () => {
  writeFileSync(keysFile, `acme:${createHash('sha256').update(key).digest('hex')}\n`);
  server = await startServer(['--auth', 'api-keys', '--api-keys-file', keysFile]);
});

after(async () => {
  assert.equal(await server?.stop(), 0, 'the server exits 0 on SIGTERM');
  rmSync(dir, { recursive: true, force: true });
});

test('the API key proves the tenant; without it the call is UNAUTHENTICATED', async () => {
  const rb = new RetryBudgetClient(server.address, { apiKey: key });
  const anonymous = new RetryBudgetClient(server.address, { tenant: 'acme' });
  try {
    await rb.nextAction({ activity_id: 'node-auth-1', attempt: 1, error_class: 'permanent' });
    assert.equal((await rb.getActivity({ activity_id: 'node-auth-1' })).tenant, 'acme');
    await assert.rejects(anonymous.getActivity({ activity_id: 'node-auth-1' }), {
      grpcStatus: 'UNAUTHENTICATED',
      stableCode: 'unauthenticated',
    });
  } finally {
    rb.close();
    anonymous.close();
  }
});
