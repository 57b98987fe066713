// The workflow of integration_test/temporal.js, bundled by the Temporal
// worker (workflow code runs in its sandbox, so it lives in a file of its own).

import { proxyActivities } from '@temporalio/workflow';

/**
 * Runs `spec.activity` once, retried by Temporal's own policy: unlimited
 * attempts (no maximumAttempts: the service stops), 1 s apart while the
 * service cannot be reached.
 */
export async function runActivity(spec) {
  const activities = proxyActivities({
    startToCloseTimeout: '10s',
    retry: { initialInterval: '1s', backoffCoefficient: 1 },
  });
  return activities[spec.activity]();
}
