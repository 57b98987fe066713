"""What deploy/'s files promise, checked without a cluster or a daemon.

    python3 deploy/promises.py embedded   # kubernetes/retry-budget.yaml
    python3 deploy/promises.py postgres   # kubernetes/retry-budget-postgres.yaml
    python3 deploy/promises.py haproxy    # haproxy.cfg and compose-postgres.yaml

Run from the repository root (deploy/validate.sh does). Prints one line a
promise ("ok" or "WRONG"); exits 1 if any is broken. Needs PyYAML.
"""

import re
import sys

import yaml

EMBEDDED = "deploy/kubernetes/retry-budget.yaml"
POSTGRES = "deploy/kubernetes/retry-budget-postgres.yaml"
CONFIG = "deploy/config.toml"
HAPROXY = "deploy/haproxy.cfg"
COMPOSE_POSTGRES = "deploy/compose-postgres.yaml"
SERVICE = "retrybudget.v1.RetryBudget"
PORT = 50051

problems = []


def check(ok, what):
    print(("ok     " if ok else "WRONG  ") + what)
    if not ok:
        problems.append(what)


def seconds(text):
    m = re.fullmatch(r"(\d+(?:\.\d+)?)(ms|s|m)", str(text))
    if not m:
        raise SystemExit("cannot read duration %r" % text)
    return float(m.group(1)) * {"ms": 0.001, "s": 1, "m": 60}[m.group(2)]


def load(path):
    return {d["kind"] + "/" + d["metadata"]["name"]: d for d in yaml.safe_load_all(open(path)) if d}


def image_uid():
    m = re.search(r"useradd .*--uid (\d+)", open("deploy/Dockerfile").read())
    return int(m.group(1))


def args_of(container):
    return dict(a[2:].split("=", 1) for a in container.get("args", []) if a.startswith("--"))


def selects(selector, labels):
    return all(labels.get(k) == v for k, v in selector.items())


def common_pod(docs, pod, c, what):
    """The promises both manifests make about their pod."""
    uid = image_uid()
    check(pod["securityContext"]["runAsUser"] == uid and pod["securityContext"]["fsGroup"] == uid,
          "%s: runAsUser and fsGroup are the image's uid %d" % (what, uid))
    csc = c["securityContext"]
    check(csc["readOnlyRootFilesystem"] and csc["capabilities"]["drop"] == ["ALL"]
          and not csc["allowPrivilegeEscalation"] and csc["seccompProfile"]["type"] == "RuntimeDefault",
          "%s: container has a read-only root, no capabilities, no privilege escalation, seccomp RuntimeDefault" % what)
    check(not pod.get("automountServiceAccountToken", True), "%s: no service-account token" % what)
    env = {e["name"]: e for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    check(env["RETRY_BUDGET_LISTEN"].get("value") == "0.0.0.0:%d" % PORT, "%s: listens on 0.0.0.0:%d" % (what, PORT))
    check(env["RETRY_BUDGET_CONFIG"].get("value") == mounts["config"] + "/config.toml",
          "%s: RETRY_BUDGET_CONFIG names the mounted ConfigMap file" % what)
    cm = [v for v in pod["volumes"] if v["name"] == "config"][0]["configMap"]["name"]
    check(docs["ConfigMap/" + cm]["data"]["config.toml"] == open(CONFIG).read(),
          "%s: the ConfigMap's config.toml is %s" % (what, CONFIG))
    res = c.get("resources", {})
    check(all(k in res.get(part, {}) for part in ("requests", "limits") for k in ("cpu", "memory")),
          "%s: cpu and memory requests and limits" % what)


def drain_of(c):
    args = args_of(c)
    return seconds(args.get("drain-delay", "2s")), seconds(args.get("grace-period", "10s"))


def embedded():
    docs = load(EMBEDDED)
    sts = docs["StatefulSet/retry-budget"]
    pod = sts["spec"]["template"]["spec"]
    labels = sts["spec"]["template"]["metadata"]["labels"]
    (c,) = pod["containers"]
    check(sts["spec"]["replicas"] == 1, "StatefulSet replicas is 1 (embedded store: one process per data dir)")
    common_pod(docs, pod, c, "StatefulSet")
    drain, grace = drain_of(c)
    check(pod["terminationGracePeriodSeconds"] > drain + grace,
          "terminationGracePeriodSeconds %s > drain-delay %s + grace-period %s" % (pod["terminationGracePeriodSeconds"], drain, grace))
    rp = c["readinessProbe"]
    check(rp["periodSeconds"] * rp["failureThreshold"] <= drain,
          "readiness notices the drain: period %s x failures %s <= drain-delay %s" % (rp["periodSeconds"], rp["failureThreshold"], drain))
    lp = c["livenessProbe"]
    check(lp["periodSeconds"] * lp["failureThreshold"] > drain + grace,
          "liveness does not restart a draining pod: %s x %s > %s" % (lp["periodSeconds"], lp["failureThreshold"], drain + grace))
    for name in ("startupProbe", "readinessProbe", "livenessProbe"):
        check(c[name]["grpc"] == {"port": PORT, "service": SERVICE}, name + " is a gRPC probe of %s on %d" % (SERVICE, PORT))
    env = {e["name"]: e.get("value") for e in c["env"]}
    mounts = {m["name"]: m["mountPath"] for m in c["volumeMounts"]}
    check(env.get("RETRY_BUDGET_DATA_DIR") == mounts["data"], "data dir is the claimed volume")
    check("RETRY_BUDGET_POSTGRES_URL" not in env, "no PostgreSQL URL: the embedded store")
    svc = docs["Service/retry-budget"]["spec"]
    check(svc["type"] == "ClusterIP" and svc["ports"][0]["name"] == "grpc" and svc["ports"][0]["appProtocol"] == "grpc",
          "Service: ClusterIP, port named grpc, appProtocol grpc")
    check(docs["Service/" + sts["spec"]["serviceName"]]["spec"].get("clusterIP") == "None", "serviceName is a headless Service")
    for name, doc in docs.items():
        if name.startswith("Service/"):
            check(selects(doc["spec"]["selector"], labels) and doc["spec"]["selector"].get("retry-budget/store") == "embedded",
                  "%s selects the StatefulSet's pods by retry-budget/store: embedded" % name)


def postgres():
    docs = load(POSTGRES)
    dep = docs["Deployment/retry-budget"]
    spec = dep["spec"]
    pod = spec["template"]["spec"]
    labels = spec["template"]["metadata"]["labels"]
    (c,) = pod["containers"]
    check(spec["replicas"] == 3, "Deployment replicas is 3")
    ru = spec["strategy"]["rollingUpdate"]
    check(spec["strategy"]["type"] == "RollingUpdate" and ru["maxUnavailable"] == 0 and ru["maxSurge"] == 1,
          "rolling update: maxUnavailable 0, maxSurge 1 (a new pod is ready before an old one stops)")
    check(selects(spec["selector"]["matchLabels"], labels), "the Deployment's selector matches its pod template")
    check(labels.get("retry-budget/store") == "postgres", "pods carry retry-budget/store: postgres")
    pdb = docs["PodDisruptionBudget/retry-budget"]["spec"]
    check(pdb["selector"] == spec["selector"], "the PodDisruptionBudget selects exactly the Deployment's pods")
    check(pdb.get("minAvailable") == 2 and pdb["minAvailable"] < spec["replicas"],
          "PodDisruptionBudget minAvailable 2 < replicas %s (evictions one at a time)" % spec["replicas"])
    common_pod(docs, pod, c, "Deployment")

    drain, grace = drain_of(c)
    pre = c["lifecycle"]["preStop"]["exec"]["command"]
    check(pre[0] == "sleep" and len(pre) == 2, "preStop sleeps before SIGTERM (the endpoints are removed meanwhile)")
    sleep = float(pre[1])
    tgps = pod["terminationGracePeriodSeconds"]
    check(tgps > sleep + drain + grace,
          "terminationGracePeriodSeconds %s > preStop %s + drain-delay %s + grace-period %s" % (tgps, sleep, drain, grace))
    rp, lp, sp = c["readinessProbe"], c["livenessProbe"], c["startupProbe"]
    check(rp["periodSeconds"] * rp["failureThreshold"] <= drain,
          "readiness notices the drain: period %s x failures %s <= drain-delay %s" % (rp["periodSeconds"], rp["failureThreshold"], drain))
    check(lp["periodSeconds"] * lp["failureThreshold"] > drain + grace,
          "liveness does not restart a draining pod: %s x %s > %s" % (lp["periodSeconds"], lp["failureThreshold"], drain + grace))
    for name, probe in (("startupProbe", sp), ("readinessProbe", rp)):
        check(probe.get("grpc") == {"port": PORT, "service": SERVICE}, name + " is a gRPC probe of %s on %d" % (SERVICE, PORT))
    check(lp.get("grpc") == {"port": PORT},
          "livenessProbe is a gRPC probe of the server's overall health (service \"\") on %d, not of the store" % PORT)

    env = {e["name"]: e for e in c["env"]}
    ref = env["RETRY_BUDGET_POSTGRES_URL"].get("valueFrom", {}).get("secretKeyRef", {})
    secret = docs.get("Secret/" + ref.get("name", ""))
    check(secret is not None and ref.get("key") in secret.get("stringData", {}),
          "RETRY_BUDGET_POSTGRES_URL comes from the Secret %s, key %s, defined in the file" % (ref.get("name"), ref.get("key")))
    url = secret["stringData"][ref["key"]] if secret else ""
    check(url.startswith("postgres://") and "REPLACE_ME" in url, "the Secret holds a postgres:// URL with a placeholder password")
    field = env["RETRY_BUDGET_REPLICA_ID"].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
    check(field == "metadata.name", "RETRY_BUDGET_REPLICA_ID is the pod's name (downward API)")
    check("RETRY_BUDGET_DATA_DIR" not in env, "no data dir of its own: the store is the database")

    spread = pod.get("topologySpreadConstraints", [])
    check({t["topologyKey"] for t in spread} >= {"kubernetes.io/hostname", "topology.kubernetes.io/zone"}
          and all(selects(t["labelSelector"]["matchLabels"], labels) for t in spread),
          "pods spread over nodes and zones")

    svc = docs["Service/retry-budget"]["spec"]
    port = svc["ports"][0]
    check(svc["type"] == "ClusterIP" and port["name"] == "grpc" and port["appProtocol"] == "grpc" and port["port"] == PORT,
          "Service retry-budget: ClusterIP, port named grpc, appProtocol grpc (meshes balance it per call)")
    check(docs["Service/retry-budget-replicas"]["spec"].get("clusterIP") == "None",
          "Service retry-budget-replicas is headless (client-side balancing)")
    for name, doc in docs.items():
        if name.startswith("Service/"):
            check(selects(doc["spec"]["selector"], labels) and doc["spec"]["selector"].get("retry-budget/store") == "postgres",
                  "%s selects the Deployment's pods by retry-budget/store: postgres" % name)

    other = load(EMBEDDED)
    sts_labels = other["StatefulSet/retry-budget"]["spec"]["template"]["metadata"]["labels"]
    check(not selects(spec["selector"]["matchLabels"], sts_labels) and not selects(pdb["selector"]["matchLabels"], sts_labels),
          "neither the Deployment nor the PodDisruptionBudget selects the embedded StatefulSet's pod")
    check(other["ConfigMap/retry-budget-config"] == docs["ConfigMap/retry-budget-config"],
          "ConfigMap retry-budget-config is the same object in both manifests")


def h2_health_check(service):
    """The bytes of a grpc.health.v1.Health/Check call over HTTP/2 with prior
    knowledge, as haproxy.cfg sends them: preface, SETTINGS, HEADERS, DATA."""
    def frame(kind, flags, stream, payload):
        return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + stream.to_bytes(4, "big") + payload

    def literal(index_prefix, value):  # HPACK literal without indexing, indexed name, no Huffman
        return index_prefix + bytes([len(value)]) + value

    path, authority = b"/grpc.health.v1.Health/Check", b"retry-budget"
    block = (bytes([0x83, 0x86])  # :method POST, :scheme http (static table 3, 6)
             + literal(b"\x04", path)  # :path (static 4)
             + literal(b"\x01", authority)  # :authority (static 1)
             + literal(b"\x0f\x10", b"application/grpc")  # content-type (static 31)
             + b"\x00\x02te" + bytes([8]) + b"trailers")  # te: new name
    message = b"\x0a" + bytes([len(service)]) + service.encode()  # HealthCheckRequest.service
    return [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n",
            frame(0x4, 0, 0, b""),  # SETTINGS, empty
            frame(0x1, 0x4, 1, block),  # HEADERS, END_HEADERS
            frame(0x0, 0x1, 1, b"\x00" + len(message).to_bytes(4, "big") + message)]  # DATA, END_STREAM


def haproxy():
    lines = [ln.split("#", 1)[0].strip() for ln in open(HAPROXY)]
    lines = [ln for ln in lines if ln]
    text = "\n".join(lines)
    check("mode http" in lines, "haproxy: mode http (requests are balanced, not connections)")
    check("balance roundrobin" in lines, "haproxy: balance roundrobin")
    binds = [ln for ln in lines if ln.startswith("bind ")]
    check(binds and all(ln.endswith("proto h2") for ln in binds), "haproxy: the frontend binds with proto h2")
    servers = [ln.split()[1] for ln in lines if ln.startswith("server ")]
    default_server = [ln for ln in lines if ln.startswith("default-server ")]
    check(len(servers) == 3 and default_server and " proto h2 " in default_server[0] + " " and " check" in default_server[0],
          "haproxy: three servers, each proto h2 with check (default-server)")
    sent = [bytes.fromhex(ln.split()[2]) for ln in lines if ln.startswith("tcp-check send-binary ")]
    check(sent == h2_health_check(SERVICE),
          "haproxy: the check is grpc.health.v1.Health/Check of %s over HTTP/2, byte for byte" % SERVICE)
    serving = (b"\x00" + (2).to_bytes(4, "big") + b"\x08\x01").hex()  # HealthCheckResponse{status: SERVING}
    check(("tcp-check expect min-recv 0 binary " + serving) in lines,
          "haproxy: a replica is up only when it answers SERVING (%s), decided without waiting" % serving)
    for t in ("connect", "client", "server", "check"):
        check(re.search(r"^timeout %s \S+$" % t, text, re.M) is not None, "haproxy: timeout %s is set" % t)

    compose = yaml.safe_load(open(COMPOSE_POSTGRES))
    services = compose["services"]
    defaults = re.findall(r'^server (\S+) "\$\{LB_SERVER_\d-([^:}]+):(\d+)\}"$', text, re.M)
    check(sorted((h, int(p)) for _, h, p in defaults) == sorted((n, PORT) for n in services if n.startswith("retry-budget-")),
          "haproxy: the servers' default addresses are compose-postgres.yaml's three replicas on %d" % PORT)
    inter = seconds(re.search(r" inter (\S+)", default_server[0]).group(1))
    fast = seconds(re.search(r" fastinter (\S+)", default_server[0]).group(1))
    fall = int(re.search(r" fall (\d+)", default_server[0]).group(1))
    noticed = inter + fast * (fall - 1)
    for name in sorted(n for n in services if n.startswith("retry-budget-")):
        s = services[name]
        args = dict(a[2:].split("=", 1) for a in s["command"] if a.startswith("--"))
        drain = seconds(args.get("drain-delay", "2s"))
        grace = seconds(args.get("grace-period", "10s"))
        env = s["environment"]
        check("RETRY_BUDGET_POSTGRES_URL" in env and env["RETRY_BUDGET_POSTGRES_URL"].startswith("postgres://")
              and env.get("RETRY_BUDGET_REPLICA_ID") == name,
              "compose %s: on PostgreSQL, replica id %s" % (name, name))
        check(noticed < drain,
              "compose %s: HAProxy notices NOT_SERVING (inter %s + fastinter %s x %s) before the drain-delay %s ends" % (name, inter, fast, fall - 1, drain))
        check(seconds(s["stop_grace_period"]) > drain + grace,
              "compose %s: stop_grace_period %s > drain-delay %s + grace-period %s" % (name, s["stop_grace_period"], drain, grace))
        check(s["depends_on"]["postgres"]["condition"] == "service_healthy", "compose %s: starts once PostgreSQL is healthy" % name)
        check("ports" not in s, "compose %s: not published (reached through HAProxy)" % name)
    check(services["postgres"].get("healthcheck") is not None, "compose postgres: has a healthcheck")


if __name__ == "__main__":
    {"embedded": embedded, "postgres": postgres, "haproxy": haproxy}[sys.argv[1]]()
    sys.exit(1 if problems else 0)
