#!/usr/bin/env bash
# Cheap static checks of deploy/ (no docker daemon, no cluster, no network):
#   - the Kubernetes manifest against the API schemas, strictly (unknown
#     fields are errors), with kubernetes-validate (PyPI; it bundles the
#     schemas), for the oldest and newest Kubernetes versions checked;
#   - the manifest's promises: one replica, the image's uid, the drain fitting
#     in terminationGracePeriodSeconds, readiness noticing the drain, the
#     ConfigMap's config.toml equal to deploy/config.toml;
#   - deploy/compose.yaml with `docker-compose config` or `docker compose
#     config` where one is installed (skipped, and said so, otherwise).
# Ends with "deploy-validate: N passed, M failed"; exits non-zero on a failure.
#
#   bash deploy/validate.sh      # K8S_VERSIONS="1.27.0 1.37.0" by default
set -euo pipefail
cd "$(dirname "$0")/.."

MANIFEST=deploy/kubernetes/retry-budget.yaml
K8S_VERSIONS=${K8S_VERSIONS:-"1.27.0 1.37.0"}
PASSED=0
FAILED=0
pass() { PASSED=$((PASSED + 1)); echo "ok   - $1"; }
fail() { FAILED=$((FAILED + 1)); echo "FAIL - $1" >&2; }

if ! command -v kubernetes-validate >/dev/null 2>&1; then
  echo "deploy-validate: installing kubernetes-validate (PyPI)"
  PIP_ROOT_USER_ACTION=ignore python3 -m pip install -q --disable-pip-version-check kubernetes-validate
  if command -v pyenv >/dev/null 2>&1; then pyenv rehash; fi
  hash -r
fi

# --- schemas ----------------------------------------------------------------------
for version in $K8S_VERSIONS; do
  if out=$(kubernetes-validate --strict -k "$version" "$MANIFEST" 2>&1); then
    echo "$out"
    pass "kubernetes-validate --strict -k $version $MANIFEST"
  else
    echo "$out" >&2
    fail "kubernetes-validate --strict -k $version $MANIFEST"
  fi
done

# --- what the manifest promises ------------------------------------------------------
uid=$(sed -n 's/.*useradd .*--uid \([0-9]*\).*/\1/p' deploy/Dockerfile)
if out=$(python3 - "$MANIFEST" deploy/config.toml "$uid" <<'EOF' 2>&1
import re, sys, yaml

manifest, config_path, image_uid = sys.argv[1], sys.argv[2], int(sys.argv[3])
docs = {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(open(manifest)) if d}
problems = []
def check(ok, what):
    print(("ok     " if ok else "WRONG  ") + what)
    if not ok:
        problems.append(what)

def seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m)", text)
    if not m:
        raise SystemExit("cannot read duration %r" % text)
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]

sts = docs["StatefulSet/retry-budget"]
pod = sts["spec"]["template"]["spec"]
(c,) = pod["containers"]
check(sts["spec"]["replicas"] == 1, "StatefulSet replicas is 1 (embedded store: one process per data dir)")
check(pod["securityContext"]["runAsUser"] == image_uid and pod["securityContext"]["fsGroup"] == image_uid,
      "runAsUser and fsGroup are the image's uid %d" % image_uid)
csc = c["securityContext"]
check(csc["readOnlyRootFilesystem"] and csc["capabilities"]["drop"] == ["ALL"]
      and not csc["allowPrivilegeEscalation"] and csc["seccompProfile"]["type"] == "RuntimeDefault",
      "container: read-only root, no capabilities, no privilege escalation, seccomp RuntimeDefault")
args = dict(a[2:].split("=", 1) for a in c["args"] if a.startswith("--"))
drain = seconds(args.get("drain-delay", "2s"))
grace = seconds(args.get("grace-period", "10s"))
check(pod["terminationGracePeriodSeconds"] > drain + grace,
      "terminationGracePeriodSeconds %s > drain-delay %s + grace-period %s" % (pod["terminationGracePeriodSeconds"], drain, grace))
rp = c["readinessProbe"]
check(rp["periodSeconds"] * rp["failureThreshold"] <= drain,
      "readiness notices the drain: period %s x failures %s <= drain-delay %s" % (rp["periodSeconds"], rp["failureThreshold"], drain))
lp = c["livenessProbe"]
check(lp["periodSeconds"] * lp["failureThreshold"] > drain + grace,
      "liveness does not restart a draining pod: %s x %s > %s" % (lp["periodSeconds"], lp["failureThreshold"], drain + grace))
for name in ("startupProbe", "readinessProbe", "livenessProbe"):
    check(c[name]["grpc"] == {"port": 50051, "service": "retrybudget.v1.RetryBudget"}, name + " is a gRPC probe of retrybudget.v1.RetryBudget on 50051")
env = {e["name"]: e.get("value") for e in c["env"]}
mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
check(env.get("RETRY_BUDGET_LISTEN") == "0.0.0.0:50051", "listens on 0.0.0.0:50051")
check(env.get("RETRY_BUDGET_DATA_DIR") == mounts["data"], "data dir is the claimed volume")
check(env.get("RETRY_BUDGET_CONFIG") == mounts["config"] + "/config.toml", "RETRY_BUDGET_CONFIG names the mounted ConfigMap file")
check(docs["ConfigMap/retry-budget-config"]["data"]["config.toml"] == open(config_path).read(),
      "the ConfigMap's config.toml is deploy/config.toml")
svc = docs["Service/retry-budget"]["spec"]
check(svc["type"] == "ClusterIP" and svc["ports"][0]["name"] == "grpc" and svc["ports"][0]["appProtocol"] == "grpc",
      "Service: ClusterIP, port named grpc, appProtocol grpc")
check(docs["Service/" + sts["spec"]["serviceName"]]["spec"].get("clusterIP") == "None", "serviceName is a headless Service")
sys.exit(1 if problems else 0)
EOF
); then
  echo "$out"
  pass "manifest promises"
else
  echo "$out" >&2
  fail "manifest promises"
fi

# --- compose ----------------------------------------------------------------------------
compose=()
if command -v docker-compose >/dev/null 2>&1; then
  compose=(docker-compose)
elif docker compose version >/dev/null 2>&1; then
  compose=(docker compose)
fi
if [[ ${#compose[@]} -eq 0 ]]; then
  echo "skip - deploy/compose.yaml: neither docker-compose nor docker compose is installed"
elif out=$("${compose[@]}" -f deploy/compose.yaml config -q 2>&1); then
  pass "${compose[*]} -f deploy/compose.yaml config -q"
else
  echo "$out" >&2
  fail "${compose[*]} -f deploy/compose.yaml config -q"
fi

echo "deploy-validate: $PASSED passed, $FAILED failed"
[[ $FAILED -eq 0 ]]
