#!/usr/bin/python3
"""test_k8s.py - the Kubernetes manifests of deploy/k8s, checked offline.

- Every core object (ConfigMap, Secret, Deployment, Service, HorizontalPodAutoscaler) is
  validated against the Kubernetes OpenAPI schemas of the oldest and the newest version
  kubernetes-validate knows, strictly (an unknown field fails); a misspelt field is shown
  to fail, so the validation is not a no-op.
- The PodMonitor (a custom resource, not in those schemas) is validated against the
  Prometheus Operator's PodMonitor schema as typed models generated from its CRD
  (cloudcoil-models-prometheus-operator), and must come back unchanged from them (an
  unknown field would be dropped, and fails).
- The pieces fit: the config's path, port and tokens file are where the Deployment mounts
  and probes them, the Services and the PodMonitor select the pods, the HPA's metric is one
  the adapter values serve and the daemon exports, the memory limit holds max_inflight_mb
  and what the process needs beside it, instance_id comes from the pod name.
- The ConfigMap's config runs on the real daemon (CPU backend, loopback, a token file of
  the test's), with GEMMD_INSTANCE_ID set to a pod name; the Secret as shipped (no token)
  makes the daemon refuse to start; the balancer's nginx config passes `nginx -t` and its
  routing expression picks the pod name out of a real job id.

kubernetes-validate and the PodMonitor models come from PyPI into a virtual environment
(scripts/venv.sh, $GEMMD_K8S_VENV or build/venv-k8s); without PyPI those checks SKIP.
"""
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from harness import GEMMD_BIN, REPO, SLOW, Daemon, Tap, free_port, parse_metrics, run_guarded  # noqa: E402

K8S = os.path.join(REPO, "deploy", "k8s")
VENV = os.environ.get("GEMMD_K8S_VENV") or os.path.join(REPO, "build", "venv-k8s")
PACKAGES = ["kubernetes-validate==1.37.0", "cloudcoil-models-prometheus-operator==0.80.1.0"]
MANIFESTS = ["configmap.yaml", "secret.yaml", "deployment.yaml", "service.yaml", "balancer.yaml", "hpa.yaml",
             "podmonitor.yaml"]
POD_NAME = "gemmd-5d8f7c9b6d-x2k9p"  # what a Deployment's pod is called

# Runs inside the venv: validates every document it is given (JSON on stdin) and prints one
# JSON line per document: [file, index, kind, name, status, detail].
VALIDATOR = r'''
import json, sys
import kubernetes_validate as kv
docs = json.load(sys.stdin)
versions = ["1.27.0", kv.latest_version()]
try:
    from cloudcoil.models.prometheus_operator.v1 import PodMonitor
except Exception as e:  # noqa: BLE001
    PodMonitor = None
    why = repr(e)
for f, i, d in docs:
    kind, name = d.get("kind"), (d.get("metadata") or {}).get("name")
    if d.get("apiVersion", "").startswith("monitoring.coreos.com/"):
        if PodMonitor is None or kind != "PodMonitor":
            print(json.dumps([f, i, kind, name, "nomodel", why if PodMonitor is None else kind]))
            continue
        try:
            back = PodMonitor.model_validate(d).model_dump(by_alias=True, exclude_none=True, mode="json")
        except Exception as e:  # noqa: BLE001
            print(json.dumps([f, i, kind, name, "invalid", str(e)[:800]]))
            continue
        print(json.dumps([f, i, kind, name, "valid" if back == d else "invalid",
                          "" if back == d else "fields the schema does not have: %r" % json.dumps(back)[:800]]))
        continue
    errs = []
    for v in versions:
        try:
            kv.validate(d, v, strict=True)
        except kv.ValidationError as e:
            errs.append("%s: %s at %s" % (v, e.message, "/".join(str(p) for p in e.path)))
        except Exception as e:  # noqa: BLE001
            errs.append("%s: %r" % (v, e))
    print(json.dumps([f, i, kind, name, "invalid" if errs else "valid", "; ".join(errs) or " and ".join(versions)]))
'''


def load_docs():
    import yaml
    out = []
    for f in MANIFESTS:
        with open(os.path.join(K8S, f)) as fh:
            for i, d in enumerate(yaml.safe_load_all(fh)):
                if d:
                    out.append((f, i, d))
    return out


def pypi_reachable():
    try:
        socket.create_connection(("pypi.org", 443), timeout=5).close()
        return True
    except OSError:
        return False


def make_venv(tap):
    """The venv's python, or None after reporting why (SKIP or failure)."""
    p = subprocess.run([os.path.join(REPO, "scripts", "venv.sh"), VENV] + PACKAGES, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=900)
    text = p.stdout.decode("utf-8", "replace")
    py = os.path.join(VENV, "bin", "python")
    if p.returncode == 0 and os.access(py, os.X_OK):
        return py
    name = "validation against the Kubernetes schemas (kubernetes-validate)"
    if "python3-venv" in text and not os.path.exists(py):
        tap.skip(name, "no virtual environment: " + text.strip().splitlines()[-1])
    elif not pypi_reachable():
        tap.skip(name, "PyPI (pypi.org:443) is unreachable, so %s cannot be installed" % " ".join(PACKAGES))
    else:
        tap.ok(False, "scripts/venv.sh installs %s" % " ".join(PACKAGES), text[-3000:])
    return None


def validate(py, docs):
    import json
    p = subprocess.run([py, "-c", VALIDATOR], input=json.dumps(docs).encode(), stdout=subprocess.PIPE,
                       stderr=subprocess.PIPE, timeout=300)
    rows = [json.loads(ln) for ln in p.stdout.decode().splitlines() if ln.startswith("[")]
    return rows, p.stderr.decode("utf-8", "replace")


def schema_checks(tap, py, docs):
    # Negative controls, checked in the same run: the same checks refuse a misspelt field.
    import copy
    dep = copy.deepcopy(next(d for f, i, d in docs if d["kind"] == "Deployment" and d["metadata"]["name"] == "gemmd"))
    c = dep["spec"]["template"]["spec"]["containers"][0]
    c["readinesProbe"] = c.pop("readinessProbe")
    pm = copy.deepcopy(next(d for f, i, d in docs if d["kind"] == "PodMonitor"))
    pm["spec"]["podMetricsEndpoints"][0]["sheme"] = "http"
    bad = [("bad-deployment", 0, dep), ("bad-podmonitor", 0, pm)]
    rows, err = validate(py, docs + bad)
    if not tap.ok(len(rows) == len(docs) + len(bad), "the validator ran on all %d objects" % len(docs), err[-2000:]):
        return
    for f, i, kind, name, status, detail in rows[:len(docs)]:
        if kind == "PodMonitor":
            if status == "nomodel":
                tap.skip("%s: PodMonitor %s against the Prometheus Operator's schema" % (f, name),
                         "the PodMonitor models would not load: %s" % detail)
            else:
                tap.ok(status == "valid", "%s: PodMonitor %s matches the Prometheus Operator's PodMonitor schema "
                       "(its CRD's typed models), no unknown field" % (f, name), detail)
        else:
            tap.ok(status == "valid", "%s: %s %s valid against the Kubernetes schemas, strict (%s)"
                   % (f, kind, name, detail if status == "valid" else "see below"), detail)
    st = {r[0]: r[4] for r in rows[len(docs):]}
    tap.ok(st.get("bad-deployment") == "invalid", "a Deployment with a misspelt field (readinesProbe) is refused", rows)
    if st.get("bad-podmonitor") != "nomodel":
        tap.ok(st.get("bad-podmonitor") == "invalid", "a PodMonitor with a misspelt field (sheme) is refused", rows)


def conf_keys(text):
    out = {}
    for line in text.splitlines():
        s = line.split("#", 1)[0].strip() if not line.lstrip().startswith("#") else ""
        if "=" in s:
            k, v = s.split("=", 1)
            out[k.strip()] = v.strip().strip('"')
    return out


def quantity(q):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|Ti)?", str(q))
    return int(m.group(1)) * {None: 1, "Ki": 1 << 10, "Mi": 1 << 20, "Gi": 1 << 30, "Ti": 1 << 40}[m.group(2)]


def find(docs, kind, name):
    return next((d for f, i, d in docs if d.get("kind") == kind and d["metadata"]["name"] == name), None)


def fit_checks(tap, docs):
    """The pieces refer to each other correctly. Returns (config text, the Secret's tokens
    file, {metric the adapter serves: series}), or None."""
    import yaml
    cm, sec, dep = find(docs, "ConfigMap", "gemmd-config"), find(docs, "Secret", "gemmd-tokens"), \
        find(docs, "Deployment", "gemmd")
    svc, pods, pm, hpa = find(docs, "Service", "gemmd"), find(docs, "Service", "gemmd-pods"), \
        find(docs, "PodMonitor", "gemmd"), find(docs, "HorizontalPodAutoscaler", "gemmd")
    if not tap.ok(all(x is not None for x in (cm, sec, dep, svc, pods, pm, hpa)),
                  "deploy/k8s has the ConfigMap, Secret, Deployment, two Services, PodMonitor and HPA"):
        return None
    conf = cm["data"]["gemmd.conf"]
    keys = conf_keys(conf)
    pod = dep["spec"]["template"]
    ps = pod["spec"]
    c = ps["containers"][0]
    labels = pod["metadata"]["labels"]
    mounts = {m["name"]: m for m in c["volumeMounts"]}
    vols = {v["name"]: v for v in ps["volumes"]}
    port = next(p for p in c["ports"] if p["name"] == "http")

    tap.ok(keys.get("listen") == "0.0.0.0" and int(keys.get("port", 0)) == port["containerPort"],
           "the config listens on 0.0.0.0 at the container's port (%s)" % keys.get("port"), keys)
    cfg_arg = c["command"][c["command"].index("--config") + 1]
    cfg_vol = next(n for n, v in vols.items() if v.get("configMap", {}).get("name") == "gemmd-config")
    tap.ok(cfg_arg == mounts[cfg_vol]["mountPath"] + "/gemmd.conf" and "gemmd.conf" in cm["data"],
           "--config names the ConfigMap's gemmd.conf where it is mounted", (cfg_arg, mounts[cfg_vol]))
    tok_vol = next(n for n, v in vols.items() if v.get("secret", {}).get("secretName") == "gemmd-tokens")
    item = vols[tok_vol]["secret"]["items"][0]
    tap.ok(keys.get("tokens_file") == mounts[tok_vol]["mountPath"] + "/" + item["path"] and
           item["key"] in sec["stringData"] and ps["securityContext"].get("fsGroup"),
           "tokens_file is the Secret's tokens, mounted read-only and readable through fsGroup",
           (keys.get("tokens_file"), item, ps["securityContext"]))
    lim, req = c["resources"]["limits"], c["resources"]["requests"]
    tap.ok(str(lim.get("nvidia.com/gpu")) == "1" and str(req.get("nvidia.com/gpu")) == "1",
           "the container asks for one GPU (nvidia.com/gpu: 1)", c["resources"])
    probes = {k: c[k]["httpGet"] for k in ("livenessProbe", "readinessProbe", "startupProbe")}
    tap.ok(probes["livenessProbe"]["path"] == "/healthz" and probes["readinessProbe"]["path"] == "/readyz" and
           all(p["port"] in ("http", port["containerPort"]) for p in probes.values()),
           "liveness probes /healthz, readiness /readyz, on the daemon's port", probes)
    # SIGTERM: the grace period holds the preStop sleep, shutdown_timeout (the ConfigMap's,
    # else the shipped config's default) and 30 s for the process to exit.
    with open(os.path.join(REPO, "config", "gemmd.conf")) as fh:
        shutdown = int(keys.get("shutdown_timeout", conf_keys(fh.read()).get("shutdown_timeout", "0")))
    pre = c.get("lifecycle", {}).get("preStop", {}).get("exec", {}).get("command", [])
    pre_s = int(pre[1]) if len(pre) == 2 and pre[0] == "sleep" else 0
    grace = ps.get("terminationGracePeriodSeconds", 30)
    tap.ok(shutdown > 0 and grace >= pre_s + shutdown + 30,
           "terminationGracePeriodSeconds %s >= preStop %d s + shutdown_timeout %d s + 30 s" % (grace, pre_s, shutdown),
           (grace, pre, shutdown))
    env = {e["name"]: e for e in c["env"]}
    tap.ok(env.get("GEMMD_INSTANCE_ID", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath") == "metadata.name"
           and "instance_id" not in keys,
           "instance_id is the pod's name (GEMMD_INSTANCE_ID from the downward API), not fixed in the ConfigMap", env)
    # Memory: the limit holds the budget, the connection buffers and the process itself.
    budget = int(keys.get("max_inflight_mb", "0")) << 20
    conn_kb = int(keys.get("connection_memory_kb", "64"))  # the daemon's default
    nconns = int(keys.get("connection_limit", "256"))
    need = budget + nconns * conn_kb * 1024 + (2 << 30)
    tap.ok(budget > 0 and quantity(lim["memory"]) >= need and quantity(req["memory"]) == quantity(lim["memory"]),
           "memory limit %s >= max_inflight_mb %s MiB + %d connections x %d KiB + 2 GiB, request = limit"
           % (lim["memory"], keys.get("max_inflight_mb"), nconns, conn_kb), (lim, req, keys))
    sel = lambda s: all(labels.get(k) == v for k, v in s.items())  # noqa: E731
    tap.ok(sel(svc["spec"]["selector"]) and sel(pods["spec"]["selector"]) and
           sel(dep["spec"]["selector"]["matchLabels"]) and sel(pm["spec"]["selector"]["matchLabels"]),
           "the Services, the Deployment's selector and the PodMonitor select the daemon's pods")
    tap.ok(pods["spec"].get("clusterIP") == "None" and pods["spec"].get("publishNotReadyAddresses") is True and
           ps.get("subdomain") == pods["metadata"]["name"],
           "pods are named in DNS through the headless Service gemmd-pods (subdomain), ready or not", pods["spec"])
    ep = pm["spec"]["podMetricsEndpoints"][0]
    cred = ep.get("authorization", {}).get("credentials", {})
    tap.ok(ep["port"] == port["name"] and ep["path"] == "/metrics" and cred.get("name") == "gemmd-tokens" and
           cred.get("key") in sec["stringData"], "the PodMonitor scrapes /metrics on the http port with a token of "
           "the Secret", ep)
    # The HPA scales the Deployment on a metric the adapter values serve.
    with open(os.path.join(K8S, "prometheus-adapter-values.yaml")) as fh:
        values = yaml.safe_load(fh)
    served = {r["name"]["as"]: r["seriesQuery"].split("{")[0] for r in values["rules"]["custom"]}
    names = [m["pods"]["metric"]["name"] for m in hpa["spec"]["metrics"] if m["type"] == "Pods"]
    tap.ok(hpa["spec"]["scaleTargetRef"]["name"] == "gemmd" and names and all(n in served for n in names),
           "the HPA scales the Deployment on %s, which prometheus-adapter-values.yaml serves" % names, served)
    return conf, sec["stringData"]["tokens"], served


class PodDaemon(Daemon):
    """The daemon as the pod runs it: gemmd --config FILE, the rest from GEMMD_* variables
    (the port too), which outrank the file."""

    def __init__(self, tap, path, env):
        self.pod_config = path
        super().__init__(tap, port_in="env", env=env)

    def start(self, wait=True):
        self.args = [GEMMD_BIN, "--config", self.pod_config]
        super().start(wait)


def daemon_checks(tap, conf, tokens_text, served):
    """The ConfigMap's config on the real daemon; the shipped Secret fails closed."""
    tmp = tempfile.TemporaryDirectory(prefix="gemmd-k8s-")
    try:
        path = os.path.join(tmp.name, "gemmd.conf")
        with open(path, "w") as f:
            f.write(conf)
        shipped = os.path.join(tmp.name, "tokens-as-shipped")
        with open(shipped, "w") as f:
            f.write(tokens_text)
        env = {k: v for k, v in os.environ.items() if not k.startswith("GEMMD_") or k in ("GEMMD_BIN", "GEMMD_BUILD")}
        env.update(GEMMD_LISTEN="127.0.0.1",  GEMMD_PORT=str(free_port()), GEMMD_BACKEND="cpu", GEMMD_TOKENS_FILE=shipped)
        p = subprocess.run([GEMMD_BIN, "--config", path], env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           timeout=60 * SLOW)
        out = p.stdout.decode("utf-8", "replace")
        if "unknown key 'max_inflight_mb'" in out:
            tap.skip("the daemon takes the ConfigMap's max_inflight_mb", "this build has no max_inflight_mb key (the "
                     "memory budget) yet; the rest of the config is run without it")
            with open(path, "w") as f:
                f.write("\n".join(ln for ln in conf.splitlines() if not ln.strip().startswith("max_inflight_mb")))
            p = subprocess.run([GEMMD_BIN, "--config", path], env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, timeout=60 * SLOW)
            out = p.stdout.decode("utf-8", "replace")
        tap.ok(p.returncode != 0 and "holds no token" in out,
               "with the Secret as shipped (no token) the daemon refuses to start", (p.returncode, out[-800:]))
        token = "k8s-test-" + os.urandom(12).hex()
        tok = os.path.join(tmp.name, "tokens")
        with open(tok, "w") as f:
            f.write(token + "\n")
        d = PodDaemon(tap, path, {"GEMMD_LISTEN": "127.0.0.1", "GEMMD_BACKEND": "cpu", "GEMMD_TOKENS_FILE": tok,
                                  "GEMMD_INSTANCE_ID": POD_NAME})
        try:
            auth = ["Authorization: Bearer " + token]
            r = d.curl("GET", "/readyz")
            tap.ok(r.status == 200, "the ConfigMap's config serves: /readyz 200 without a token (the probe)", r)
            r = d.curl("GET", "/v1/info", headers=auth)
            tap.ok(r.status == 200 and (r.json() or {}).get("instance_id") == POD_NAME and
                   r.header("x-gemm-instance") == POD_NAME, "instance_id is the pod name given in GEMMD_INSTANCE_ID", r)
            r0 = d.curl("GET", "/metrics")
            r, m = d.curl("GET", "/metrics", headers=auth), None
            if r.status == 200:
                m = parse_metrics(r.body.decode())
            exported = {k[0] for k in (m or {})}
            tap.ok(r0.status == 401 and m is not None and set(served.values()) <= exported,
                   "/metrics needs the token, and exports every series the adapter serves (%s)"
                   % sorted(served.values()), (r0.status, sorted(set(served.values()) - exported)))
            body = b'{"a":[[1,2],[3,4]],"b":[[5],[6]]}'
            r = d.curl("POST", "/v1/jobs", data=body, content_type="application/json", headers=auth)
            jid = (r.json() or {}).get("id", "")
            tap.ok(r.status == 202 and jid.startswith(POD_NAME + "-"), "a job id starts with the pod name", r)
        finally:
            d.stop_and_check("the daemon with the ConfigMap's config exits 0 on SIGTERM")
            d.cleanup()
    finally:
        tmp.cleanup()


def balancer_checks(tap, docs):
    cm = find(docs, "ConfigMap", "gemmd-balancer")
    dep = find(docs, "Deployment", "gemmd-balancer")
    conf = cm["data"]["nginx.conf.in"]
    args = " ".join(dep["spec"]["template"]["spec"]["containers"][0]["args"])
    tap.ok(all(("@%s@" % k) in conf and ("s/@%s@/" % k) in args for k in ("RESOLVER", "NAMESPACE", "DOMAIN")),
           "the balancer fills in every placeholder of its config when it starts")
    # The same streaming and retry settings as the recipe.
    with open(os.path.join(REPO, "config", "nginx", "gemmd.conf")) as f:
        recipe = f.read()
    settings = [ln.strip() for ln in recipe.splitlines() if re.match(
        r"\s*(client_max_body_size|proxy_request_buffering|proxy_buffering|proxy_buffer_size|proxy_http_version|"
        r"proxy_next_upstream|proxy_connect_timeout|proxy_read_timeout|proxy_send_timeout)\b", ln)]
    missing = [s for s in settings if s not in conf]
    tap.ok(settings and not missing, "the balancer has the recipe's streaming, timeout and retry settings", missing)
    # The routing expression takes the pod name out of a real id (nginx's (?<n>...) in Python).
    with Daemon(tap, config={"instance_id": POD_NAME}) as d:
        r = d.curl("POST", "/v1/jobs", data=b'{"a":[[1]],"b":[[2]]}', content_type="application/json")
        jid = (r.json() or {}).get("id")
    m = re.search(r'"~(\^/v1/jobs/.*?\$)"', conf)
    rx = re.compile(m.group(1).replace("(?<", "(?P<")) if m else None
    got = rx.match("/v1/jobs/%s/result" % jid) if rx and jid else None
    tap.ok(got is not None and got.group("gemmd_inst") == POD_NAME,
           "the balancer's map takes the pod name out of a job id", (m and m.group(1), jid))
    nginx = shutil.which("nginx") or ("/usr/sbin/nginx" if os.access("/usr/sbin/nginx", os.X_OK) else None)
    if not nginx:
        tap.skip("nginx -t on the balancer's config", "no nginx; install it: sudo apt-get install -y nginx")
        return
    tmp = tempfile.mkdtemp(prefix="nginx-k8s-", dir=os.path.join(REPO, os.environ.get("GEMMD_BUILD", "build")))
    try:
        os.chmod(tmp, 0o755)
        text = conf.replace("@RESOLVER@", "127.0.0.1").replace("@NAMESPACE@", "default") \
            .replace("@DOMAIN@", "cluster.local").replace("/tmp/nginx", tmp) \
            .replace("server gemmd.default.svc.cluster.local:8080", "server 127.0.0.1:8080")  # no cluster DNS here
        path = os.path.join(tmp, "nginx.conf")
        with open(path, "w") as f:
            f.write(text)
        p = subprocess.run([nginx, "-t", "-p", tmp, "-e", "stderr", "-c", path], stdout=subprocess.PIPE,
                           stderr=subprocess.STDOUT, timeout=30)
        tap.ok(p.returncode == 0, "nginx -t accepts the balancer's config (cluster names replaced by loopback)",
               p.stdout.decode("utf-8", "replace"))
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


def main(tap):
    try:
        import yaml  # noqa: F401
    except ImportError:
        tap.skip("deploy/k8s manifests", "no PyYAML for /usr/bin/python3; install it: sudo apt-get install -y "
                 "python3-yaml")
        return
    docs = load_docs()
    tap.ok(len(docs) >= 10, "deploy/k8s: %d objects parsed as YAML" % len(docs))
    py = make_venv(tap)
    if py:
        schema_checks(tap, py, docs)
    conf, tokens, served = fit_checks(tap, docs) or (None, None, None)
    if conf:
        daemon_checks(tap, conf, tokens, served)
    balancer_checks(tap, docs)


if __name__ == "__main__":
    run_guarded(Tap(), main)
