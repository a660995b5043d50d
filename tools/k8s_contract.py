"""``python tools/k8s_contract.py RENDERED.yaml [base|overlay]``: the runtime contract of
docs/kubernetes.md on the objects ``kubectl kustomize`` rendered from k8s/base or one of k8s/overlays/
(.ci/k8s-validate runs it on each; exit status 1 on any failure).

The namespace is the rendered Namespace's, the cluster domain the one the first Authority shard
advertises; every other in-cluster name must agree with both. ``overlay`` (the default) also asks for
what an applied overlay needs and the base leaves out: every ConfigMap the pods read, either every
Secret or none (created out of band), no placeholder in a Secret, and engines run beside the mesh
(PostgreSQL, the S3 store) that are reachable by their consumers only.
"""

import base64
import re
import sys
from urllib.parse import urlsplit

import yaml

HEALTH = {
    "authority": "missionweave.v1.AuthorityService",
    "membership": "missionweave.v1.MembershipService",
    "scheduling": "missionweave.v1.SchedulingService",
    "artifacts": "missionweave.v1.ArtifactService",
    "gateway": "missionweave.v1.GatewayService",
}
# The Secrets and ConfigMaps each service's pods may reference, and no others.
SECRETS = {
    "authority": {"missionweave-database", "missionweave-authority-key"},
    "membership": {"missionweave-database", "missionweave-admin-key"},
    "scheduling": {"missionweave-database"},
    "artifacts": {"missionweave-database", "missionweave-s3"},
    "gateway": {"missionweave-database"},
}
# Every service's pods mount their own TLS Secret, and only theirs (docs/tls.md).
# ...and the mesh token every service proves itself to its peers with (docs/security.md).
for _name in SECRETS:
    SECRETS[_name].add(f"missionweave-tls-{_name}")
    SECRETS[_name].add("missionweave-mesh-token")
TLS_DIR = "/etc/missionweave/tls"
TLS_CONFIG = {
    "MWP_TLS_CERT": f"{TLS_DIR}/tls.crt",
    "MWP_TLS_KEY": f"{TLS_DIR}/tls.key",
    "MWP_TLS_CA": f"{TLS_DIR}/ca.crt",
    "MWP_TLS_CLIENT_CERT": f"{TLS_DIR}/tls.crt",
    "MWP_TLS_CLIENT_KEY": f"{TLS_DIR}/tls.key",
}
CONFIGMAPS = {name: {"missionweave-config"} for name in HEALTH}
CONFIGMAPS["artifacts"] = {"missionweave-config", "missionweave-s3"}
PART_OF = ("app.kubernetes.io/part-of", "missionweave")
PORT = 50051
HEALTH_PORT = 50052
METRICS_PORT = 9464
CONSOLE_PORT = 50080
BAD_PDB = "protects no pod, or lets no drain evict one (needs 1 <= n < replicas)"

with open(sys.argv[1]) as f:
    docs = [d for d in yaml.safe_load_all(f) if d]
OVERLAY = (sys.argv[2] if len(sys.argv) > 2 else "overlay") == "overlay"
problems: list[str] = []
count = 0


def check(ok: bool, what: str) -> None:
    global count
    count += 1
    if not ok:
        problems.append(what)


def of_kind(kind: str) -> list[dict]:
    return [d for d in docs if d["kind"] == kind]


def matches(selector: dict, labels: dict) -> bool:
    for k, v in (selector.get("matchLabels") or {}).items():
        if labels.get(k) != v:
            return False
    for e in selector.get("matchExpressions") or []:
        key, op, values = e["key"], e["operator"], e.get("values") or []
        if op == "In" and labels.get(key) not in values:
            return False
        if op == "NotIn" and key in labels and labels[key] in values:
            return False
        if op == "Exists" and key not in labels:
            return False
        if op == "DoesNotExist" and key in labels:
            return False
    return True


def env_of(container: dict) -> dict[str, dict]:
    return {e["name"]: e for e in container.get("env") or []}


def refs(pod: dict) -> tuple[set[str], set[str]]:
    secrets: set[str] = set()
    configmaps: set[str] = set()
    for v in pod.get("volumes") or []:
        if "secret" in v:
            secrets.add(v["secret"]["secretName"])
        if "configMap" in v:
            configmaps.add(v["configMap"]["name"])
        for source in (v.get("projected") or {}).get("sources") or []:
            if "secret" in source:
                secrets.add(source["secret"]["name"])
            if "configMap" in source:
                configmaps.add(source["configMap"]["name"])
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        for e in c.get("envFrom") or []:
            if "secretRef" in e:
                secrets.add(e["secretRef"]["name"])
            if "configMapRef" in e:
                configmaps.add(e["configMapRef"]["name"])
        for e in c.get("env") or []:
            source = e.get("valueFrom") or {}
            if "secretKeyRef" in source:
                secrets.add(source["secretKeyRef"]["name"])
            if "configMapKeyRef" in source:
                configmaps.add(source["configMapKeyRef"]["name"])
    return secrets, configmaps


def restricted(pod: dict, label: str) -> None:
    """The restricted Pod Security Standard the namespace enforces, checked here so that a pod the
    admission would refuse fails offline."""
    ctx = pod.get("securityContext") or {}
    check(ctx.get("runAsNonRoot") is True, f"{label}: securityContext.runAsNonRoot must be true")
    check(
        (ctx.get("seccompProfile") or {}).get("type") == "RuntimeDefault",
        f"{label}: seccompProfile must be RuntimeDefault",
    )
    check(
        pod.get("automountServiceAccountToken") is False, f"{label}: must not mount a service account token"
    )
    for c in (pod.get("initContainers") or []) + pod["containers"]:
        sc = c.get("securityContext") or {}
        check(
            sc.get("allowPrivilegeEscalation") is False
            and sc.get("readOnlyRootFilesystem") is True
            and (sc.get("capabilities") or {}).get("drop") == ["ALL"]
            and not (sc.get("capabilities") or {}).get("add"),
            f"{label}: container {c['name']} must drop ALL capabilities, forbid privilege escalation and "
            "run on a read-only root filesystem",
        )


def template_of(w: dict) -> dict:
    """The pod template of a workload, a Job or a CronJob (the db-upgrade Job's template)."""
    spec = w["spec"]["jobTemplate"]["spec"] if w["kind"] == "CronJob" else w["spec"]
    return spec["template"]


def pod_of(w: dict) -> dict:
    return template_of(w)["spec"]


def labels_of(w: dict) -> dict:
    return template_of(w)["metadata"].get("labels") or {}


# Every namespaced object in the one Namespace, which enforces the restricted Pod Security Standard.
namespaces = of_kind("Namespace")
check(len(namespaces) == 1, f"expected one Namespace, found {len(namespaces)}")
NS = namespaces[0]["metadata"]["name"] if namespaces else "missionweave"
check(
    bool(namespaces)
    and (namespaces[0]["metadata"].get("labels") or {}).get("pod-security.kubernetes.io/enforce")
    == "restricted",
    f"Namespace {NS} must enforce the restricted Pod Security Standard",
)
for d in docs:
    if d["kind"] != "Namespace":
        got = d["metadata"].get("namespace")
        check(got == NS, f"{d['kind']} {d['metadata']['name']} is in namespace {got!r}, not {NS}")
all_pods = [
    (f"{w['kind']} {w['metadata']['name']}", w)
    for w in of_kind("Deployment") + of_kind("StatefulSet") + of_kind("Job") + of_kind("CronJob")
]
for label, w in all_pods:
    restricted(pod_of(w), label)

# The cluster domain: the one the first Authority shard advertises (checked below against the rest).
DOMAIN = "cluster.local"
for sts in of_kind("StatefulSet"):
    if sts["metadata"]["name"] == "authority":
        advertised = (env_of(pod_of(sts)["containers"][0]).get("MWP_ADVERTISE_ADDR") or {}).get("value") or ""
        m = re.fullmatch(r"\$\(POD_NAME\)\.[a-z0-9-]+\.[a-z0-9-]+\.svc\.([a-z0-9.-]+):\d+", advertised)
        check(m is not None, f"authority: MWP_ADVERTISE_ADDR {advertised!r} names no cluster domain")
        DOMAIN = m.group(1) if m else DOMAIN

config = next(
    (d.get("data") or {} for d in of_kind("ConfigMap") if d["metadata"]["name"] == "missionweave-config"),
    None,
)
check(config is not None, "ConfigMap missionweave-config is missing")
config = config or {}
services = {d["metadata"]["name"]: d for d in of_kind("Service")}

# Which workload serves which service (MWP_SERVICES), its probes and its Secrets.
workloads: dict[str, dict] = {}
for w in of_kind("Deployment") + of_kind("StatefulSet"):
    if labels_of(w).get(PART_OF[0]) != PART_OF[1]:
        continue  # an engine run beside the mesh (the dev overlay's PostgreSQL and S3 store): below
    label = f"{w['kind']} {w['metadata']['name']}"
    pod = w["spec"]["template"]["spec"]
    containers = pod["containers"]
    check(len(containers) == 1, f"{label}: expected one container, found {len(containers)}")
    c = containers[0]
    served = (env_of(c).get("MWP_SERVICES") or {}).get("value", "")
    check(served in HEALTH, f"{label}: MWP_SERVICES must name one service of {sorted(HEALTH)}, is {served!r}")
    if served not in HEALTH:
        continue
    check(served not in workloads, f"{label}: a second workload serves {served}")
    workloads[served] = w
    for probe in ("startupProbe", "readinessProbe"):
        got = ((c.get(probe) or {}).get("grpc") or {}).get("service")
        check(got == HEALTH[served], f"{label}: {probe} must be gRPC health for {HEALTH[served]}, is {got!r}")
    live = (c.get("livenessProbe") or {}).get("grpc")
    check(
        live is not None and live.get("service", "") == "",
        f"{label}: livenessProbe must be gRPC health for ''",
    )
    # TLS: kubelet's gRPC probes speak plain text, so they ask the health-only port (MWP_HEALTH_LISTEN).
    for probe in ("startupProbe", "readinessProbe", "livenessProbe"):
        port = ((c.get(probe) or {}).get("grpc") or {}).get("port")
        check(
            port == HEALTH_PORT,
            f"{label}: {probe} must ask the health port {HEALTH_PORT} (TLS on {PORT}), asks {port!r}",
        )
    declared = {p.get("containerPort") for p in c.get("ports") or []}
    check({PORT, HEALTH_PORT} <= declared, f"{label}: must declare container ports {PORT} and {HEALTH_PORT}")
    # Prometheus finds every pod's metrics (MWP_METRICS_LISTEN) by its annotations.
    scrape = w["spec"]["template"].get("metadata", {}).get("annotations") or {}
    check(
        METRICS_PORT in declared
        and scrape.get("prometheus.io/scrape") == "true"
        and scrape.get("prometheus.io/port") == str(METRICS_PORT),
        f"{label}: must declare container port {METRICS_PORT} and annotate prometheus.io/scrape and /port for it",
    )
    client_ca = (env_of(c).get("MWP_TLS_CLIENT_CA") or {}).get("value")
    if served == "gateway":
        check(
            client_ca is None,
            f"{label}: agents have no client certificates: the gateway must not set MWP_TLS_CLIENT_CA",
        )
    else:
        check(
            client_ca == f"{TLS_DIR}/ca.crt",
            f"{label}: MWP_TLS_CLIENT_CA must be {TLS_DIR}/ca.crt (mTLS), is {client_ca!r}",
        )
    tls_volumes = {
        v["name"]
        for v in pod.get("volumes") or []
        if (v.get("secret") or {}).get("secretName") == f"missionweave-tls-{served}"
    }
    check(
        any(
            m.get("name") in tls_volumes and m.get("mountPath") == TLS_DIR
            for m in c.get("volumeMounts") or []
        ),
        f"{label}: must mount Secret missionweave-tls-{served} at {TLS_DIR}",
    )
    secrets, configmaps = refs(pod)
    check(
        secrets == SECRETS[served],
        f"{label}: references Secrets {sorted(secrets)}, expected {sorted(SECRETS[served])}",
    )
    check(
        configmaps == CONFIGMAPS[served],
        f"{label}: references ConfigMaps {sorted(configmaps)}, expected {sorted(CONFIGMAPS[served])}",
    )
    check(
        ("MWP_AUTHORITY_KEY" in env_of(c)) == (served == "authority"),
        f"{label}: MWP_AUTHORITY_KEY is for authority pods only",
    )
    check(
        "MWP_DATABASE_URL" in env_of(c),
        f"{label}: every service keeps its tables in the database (MWP_DATABASE_URL)",
    )
    # The web console (docs/console.md) is served where the gateway is, and only there.
    named = {p.get("name"): p.get("containerPort") for p in c.get("ports") or []}
    console_listen = (env_of(c).get("MWP_CONSOLE_LISTEN") or {}).get("value")
    if served == "gateway":
        check(
            console_listen == f"0.0.0.0:{CONSOLE_PORT}",
            f"{label}: the gateway serves the web console: MWP_CONSOLE_LISTEN must be 0.0.0.0:{CONSOLE_PORT}, is {console_listen!r}",
        )
        check(
            named.get("console") == CONSOLE_PORT,
            f"{label}: must declare container port {CONSOLE_PORT} named console",
        )
        hosts = [
            h.strip()
            for h in ((env_of(c).get("MWP_CONSOLE_HOSTS") or {}).get("value") or "").split(",")
            if h.strip()
        ]
        check(
            bool(hosts),
            f"{label}: MWP_CONSOLE_HOSTS must name the Host headers the console answers to "
            "(on 0.0.0.0 without it, it answers any: no defence against DNS rebinding)",
        )
    else:
        check(
            "console" not in named and CONSOLE_PORT not in declared and not console_listen,
            f"{label}: only the gateway serves the web console",
        )
check(sorted(workloads) == sorted(HEALTH), f"workloads serve {sorted(workloads)}, expected {sorted(HEALTH)}")
for key in ("MWP_AUTHORITY_KEY", "MWP_DATABASE_URL", "MWP_INSTANCE_ID", "MWP_ADVERTISE_ADDR", "MWP_SERVICES"):
    check(key not in config, f"ConfigMap missionweave-config must not set the per-pod {key}")
for key in config:
    check(
        not key.startswith(("MWP_S3_", "AWS_")),
        f"ConfigMap missionweave-config must not set {key} (artifacts only)",
    )
for key, value in TLS_CONFIG.items():
    check(
        config.get(key) == value,
        f"ConfigMap missionweave-config: {key} must be {value}, is {config.get(key)!r}",
    )
check(
    config.get("MWP_METRICS_LISTEN") == f"0.0.0.0:{METRICS_PORT}",
    f"ConfigMap missionweave-config: MWP_METRICS_LISTEN must be 0.0.0.0:{METRICS_PORT}",
)
check(
    config.get("MWP_HEALTH_LISTEN") == f"0.0.0.0:{HEALTH_PORT}",
    f"ConfigMap missionweave-config: MWP_HEALTH_LISTEN must be 0.0.0.0:{HEALTH_PORT}",
)
check(
    config.get("MWP_INSECURE", "0").lower() in ("", "0", "false", "no", "off"),
    "ConfigMap missionweave-config must not set MWP_INSECURE: the pods serve TLS",
)
check("MWP_TLS_CLIENT_CA" not in config, "MWP_TLS_CLIENT_CA is per workload (not the gateway)")
for key in ("MWP_CONSOLE_LISTEN", "MWP_CONSOLE_HOSTS"):
    check(key not in config, f"ConfigMap missionweave-config must not set {key} (the gateway's own env)")
gateway_service = (services.get("gateway") or {}).get("spec") or {}
check(
    any(
        p.get("port") == CONSOLE_PORT and p.get("targetPort") in ("console", CONSOLE_PORT)
        for p in gateway_service.get("ports") or []
    ),
    f"Service gateway must expose the web console: port {CONSOLE_PORT} to the pods' port console",
)


def check_pods_listed(service):
    """A StatefulSet of several pods, its headless Service, and MWP_<SERVICE>_ADDR listing every
    pod in ordinal order: the Authority's shards (placed by Group) and the scheduling replicas
    (placed by Worker) are each dialled by name, never through a balancing Service."""
    sts = workloads.get(service)
    check(sts is not None and sts["kind"] == "StatefulSet", f"{service} must be a StatefulSet")
    if sts is None or sts["kind"] != "StatefulSet":
        return None
    name, ns = sts["metadata"]["name"], sts["metadata"]["namespace"]
    headless = sts["spec"]["serviceName"]
    replicas = sts["spec"].get("replicas", 1)
    check(replicas >= 2, f"{service} runs {replicas} pod(s): the split topology has several")
    hs = services.get(headless) or {}
    check(
        hs.get("spec", {}).get("clusterIP") == "None",
        f"Service {headless} must exist and be headless (clusterIP: None)",
    )
    check(
        matches(
            {"matchLabels": hs.get("spec", {}).get("selector") or {"-": "-"}},
            sts["spec"]["template"]["metadata"]["labels"],
        ),
        f"Service {headless} must select the {service} pods",
    )
    check(
        any(p.get("port") == PORT for p in hs.get("spec", {}).get("ports") or []),
        f"Service {headless} must serve port {PORT}",
    )
    key = f"MWP_{service.upper()}_ADDR"
    expected = [f"{name}-{i}.{headless}.{ns}.svc.{DOMAIN}:{PORT}" for i in range(replicas)]
    got = [a.strip() for a in config.get(key, "").split(",") if a.strip()]
    check(got == expected, f"{key} must list the {replicas} pods in ordinal order: {expected}, is {got}")
    check(service not in services, f"no balancing Service '{service}' in front of its pods")
    return sts, headless, ns


check_pods_listed("scheduling")
# The Authority shards also advertise their own address (named in NOT_OWNER answers).
listed = check_pods_listed("authority")
if listed is not None:
    sts, headless, ns = listed
    env = env_of(sts["spec"]["template"]["spec"]["containers"][0])
    names = [e["name"] for e in sts["spec"]["template"]["spec"]["containers"][0].get("env") or []]
    for key in ("MWP_INSTANCE_ID", "POD_NAME"):
        got = ((env.get(key) or {}).get("valueFrom") or {}).get("fieldRef", {}).get("fieldPath")
        check(
            got == "metadata.name",
            f"authority: {key} must come from the downward API's metadata.name, is {got!r}",
        )
    advertise = (env.get("MWP_ADVERTISE_ADDR") or {}).get("value")
    check(
        advertise == f"$(POD_NAME).{headless}.{ns}.svc.{DOMAIN}:{PORT}",
        f"authority: MWP_ADVERTISE_ADDR is {advertise!r}",
    )
    check(
        "POD_NAME" in names
        and "MWP_ADVERTISE_ADDR" in names
        and names.index("POD_NAME") < names.index("MWP_ADVERTISE_ADDR"),
        "authority: POD_NAME must be defined before MWP_ADVERTISE_ADDR (which expands it)",
    )

# The other peers: one ClusterIP Service each, selecting the pods that serve it.
for peer in ("membership", "artifacts"):
    key = f"MWP_{peer.upper()}_ADDR"
    w = workloads.get(peer)
    s = services.get(peer) or {}
    ns = s.get("metadata", {}).get("namespace", "?")
    check(
        config.get(key) == f"{peer}.{ns}.svc.{DOMAIN}:{PORT}",
        f"{key} must be {peer}.{ns}.svc.{DOMAIN}:{PORT}, is {config.get(key)!r}",
    )
    check(
        bool(s) and any(p.get("port") == PORT for p in s["spec"].get("ports") or []),
        f"Service {peer} must serve port {PORT}",
    )
    check(
        bool(s)
        and w is not None
        and matches(
            {"matchLabels": s["spec"].get("selector") or {"-": "-"}},
            w["spec"]["template"]["metadata"]["labels"],
        ),
        f"Service {peer} must select the {peer} pods",
    )

# PodDisruptionBudgets: one per workload, protecting at least one pod and still letting a drain go on.
pdbs = of_kind("PodDisruptionBudget")
for served, w in workloads.items():
    labels = w["spec"]["template"]["metadata"]["labels"]
    replicas = w["spec"].get("replicas", 1)
    mine = [p for p in pdbs if matches(p["spec"]["selector"], labels)]
    check(len(mine) == 1, f"{served}: expected one PodDisruptionBudget, found {len(mine)}")
    for p in mine:
        spec = p["spec"]
        if "maxUnavailable" in spec:
            m = spec["maxUnavailable"]
            ok = isinstance(m, int) and 1 <= m < replicas
            check(ok, f"PDB {p['metadata']['name']}: maxUnavailable {m!r} of {replicas} replicas {BAD_PDB}")
        else:
            n = spec.get("minAvailable")
            ok = isinstance(n, int) and 1 <= n < replicas
            check(ok, f"PDB {p['metadata']['name']}: minAvailable {n!r} of {replicas} replicas {BAD_PDB}")

# NetworkPolicies: default deny; anyone may reach the gateway; the rest only from mesh pods.
policies = [p for p in of_kind("NetworkPolicy") if "Ingress" in (p["spec"].get("policyTypes") or ["Ingress"])]
check(
    any(p["spec"].get("podSelector") == {} and not p["spec"].get("ingress") for p in policies),
    "no default-deny ingress NetworkPolicy",
)
gateway_labels = (
    workloads["gateway"]["spec"]["template"]["metadata"]["labels"] if "gateway" in workloads else {}
)
for served, w in workloads.items():
    labels = w["spec"]["template"]["metadata"]["labels"]
    rules = [
        r
        for p in policies
        if matches(p["spec"].get("podSelector") or {}, labels)
        for r in p["spec"].get("ingress") or []
    ]
    check(bool(rules), f"{served}: no NetworkPolicy lets anything in")
    if served == "gateway":
        check(any(not r.get("from") for r in rules), "gateway: must accept gRPC from anywhere")
        check(
            any(
                not r.get("from")
                and (
                    not r.get("ports") or any(p.get("port") in ("console", CONSOLE_PORT) for p in r["ports"])
                )
                for r in rules
            ),
            f"gateway: must accept the web console ({CONSOLE_PORT}) from anywhere",
        )
        continue
    for r in rules:
        peers = r.get("from") or []
        if r.get("ports") and all(p.get("port") in ("metrics", METRICS_PORT) for p in r["ports"]):
            continue  # the metrics port alone (Prometheus, from its namespace): never gRPC
        check(
            bool(peers)
            and all(
                set(x) == {"podSelector"}
                and (x["podSelector"].get("matchLabels") or {}).get(PART_OF[0]) == PART_OF[1]
                for x in peers
            ),
            f"{served}: an ingress rule admits more than this namespace's pods labelled {PART_OF[0]}={PART_OF[1]}: {r}",
        )
    # Same-namespace pod peers only (any other kind of peer already failed above).
    sources = [x["podSelector"] for r in rules for x in r.get("from") or [] if set(x) == {"podSelector"}]
    check(any(matches(sel, gateway_labels) for sel in sources), f"{served}: the gateway cannot reach it")
    if served == "authority":
        check(any(matches(sel, labels) for sel in sources), "authority: shards cannot reach one another")

# The front door's names: the clients' proofs name the address they dialled (MWP_AUDIENCE), browsers
# the console's Host (MWP_CONSOLE_HOSTS); both must name the gateway in this namespace and domain,
# and every Ingress host that leads to it.
audience = [a.strip() for a in config.get("MWP_AUDIENCE", "").split(",") if a.strip()]
check(
    f"gateway.{NS}.svc.{DOMAIN}:{PORT}" in audience,
    f"MWP_AUDIENCE must name gateway.{NS}.svc.{DOMAIN}:{PORT}, is {audience}",
)
gateway_env = env_of(pod_of(workloads["gateway"])["containers"][0]) if "gateway" in workloads else {}
console_hosts = [
    h.strip() for h in ((gateway_env.get("MWP_CONSOLE_HOSTS") or {}).get("value") or "").split(",")
]
check(
    f"gateway.{NS}.svc.{DOMAIN}:{CONSOLE_PORT}" in console_hosts,
    f"MWP_CONSOLE_HOSTS must name gateway.{NS}.svc.{DOMAIN}:{CONSOLE_PORT}",
)
for name in audience + console_hosts:
    m = re.fullmatch(r"[a-z0-9-]+\.([a-z0-9-]+)\.svc(?:\.([a-z0-9.-]+))?:\d+", name)
    if m:
        check(
            m.group(1) == NS and m.group(2) in (None, DOMAIN),
            f"{name} names another namespace or cluster domain than {NS}, {DOMAIN}",
        )
for ing in of_kind("Ingress"):
    label = f"Ingress {ing['metadata']['name']}"
    tls_hosts = {h for t in ing["spec"].get("tls") or [] for h in t.get("hosts") or []}
    check(bool(tls_hosts), f"{label}: must end TLS (spec.tls): the front door speaks nothing else")
    for rule in ing["spec"].get("rules") or []:
        host = rule.get("host")
        check(host in tls_hosts, f"{label}: host {host!r} has no TLS certificate (spec.tls)")
        for path in (rule.get("http") or {}).get("paths") or []:
            backend = path["backend"].get("service") or {}
            port = (backend.get("port") or {}).get("name") or (backend.get("port") or {}).get("number")
            check(
                backend.get("name") == "gateway",
                f"{label}: leads to {backend.get('name')!r}: only the gateway is a front door",
            )
            if port in ("grpc", PORT):
                check(
                    f"{host}:443" in audience,
                    f"{label}: MWP_AUDIENCE must name {host}:443, the address agents dial",
                )
            elif port in ("console", CONSOLE_PORT):
                check(
                    host in console_hosts,
                    f"{label}: MWP_CONSOLE_HOSTS must name {host}, the Host browsers send",
                )
            else:
                check(False, f"{label}: leads to gateway port {port!r}, neither grpc nor console")
    notes = ing["metadata"].get("annotations") or {}
    for key, want in (
        ("nginx.ingress.kubernetes.io/proxy-ssl-name", f"gateway.{NS}.svc.{DOMAIN}"),
        ("nginx.ingress.kubernetes.io/proxy-ssl-secret", f"{NS}/missionweave-tls-gateway"),
    ):
        if key in notes:
            check(notes[key] == want, f"{label}: {key} must be {want}, is {notes[key]!r}")

# What the pods read and the overlay (not the base) provides.
secrets = {d["metadata"]["name"]: d for d in of_kind("Secret")}
configmaps = {d["metadata"]["name"] for d in of_kind("ConfigMap")}
wanted_secrets: set[str] = set()
wanted_configmaps: set[str] = set()
for _label, w in all_pods:
    got_s, got_c = refs(pod_of(w))
    wanted_secrets |= got_s
    wanted_configmaps |= got_c
if OVERLAY:
    check(
        wanted_configmaps <= configmaps,
        f"the pods read ConfigMaps the overlay does not render: {sorted(wanted_configmaps - configmaps)}",
    )
    # All or nothing: an overlay generates every Secret (dev) or leaves them all to the operator (prod).
    check(
        not secrets or wanted_secrets <= set(secrets),
        f"the overlay renders Secrets but not {sorted(wanted_secrets - set(secrets))}",
    )
else:
    check(not secrets, "the base renders no Secret: the overlays provide them")
# The words the old placeholder Secrets used. Not searched in PEM, whose base64 may spell anything.
PLACEHOLDER = re.compile(r"CHANGE_?ME|REPLACE|PLACEHOLDER", re.IGNORECASE)
HEX64 = re.compile(r"[0-9a-f]{64}\s*")
for name, sec in secrets.items():
    values = {k: base64.b64decode(v).decode() for k, v in (sec.get("data") or {}).items()}
    values.update(sec.get("stringData") or {})
    for k, v in values.items():
        check("-----BEGIN" in v or not PLACEHOLDER.search(v), f"Secret {name}: {k} holds a placeholder")
    for key in ("authority.key", "admin.key", "mesh.token"):
        if key in values:
            check(bool(HEX64.fullmatch(values[key])), f"Secret {name}: {key} must be 64 hex characters")
    if sec.get("type") == "kubernetes.io/tls":
        check(
            all("-----BEGIN" in values.get(k, "") for k in ("tls.crt", "tls.key", "ca.crt")),
            f"Secret {name}: tls.crt, tls.key and ca.crt must be PEM",
        )

# Engines run beside the mesh (the dev overlay): the address the mesh is given must be a Service of
# this namespace selecting them; their pods probed, admitted only from the pods that use them.
engine_workloads = [
    w for w in of_kind("Deployment") + of_kind("StatefulSet") if labels_of(w).get(PART_OF[0]) != PART_OF[1]
]
s3_config = next(
    (d.get("data") or {} for d in of_kind("ConfigMap") if d["metadata"]["name"] == "missionweave-s3"), {}
)
db_secret = secrets.get("missionweave-database")
db_url = ""
if db_secret:
    db_url = (db_secret.get("stringData") or {}).get("MWP_DATABASE_URL") or base64.b64decode(
        (db_secret.get("data") or {}).get("MWP_DATABASE_URL", "")
    ).decode()
mesh_labels = {served: labels_of(w) for served, w in workloads.items()}
bucket_jobs = [j for j in of_kind("Job") if "missionweave-s3" in refs(pod_of(j))[1]]
endpoints = [
    ("database", db_url, list(mesh_labels.values())),
    ("S3 store", s3_config.get("MWP_S3_ENDPOINT", ""), [mesh_labels.get("artifacts", {})]),
]
for what, url, consumers in endpoints:
    host = urlsplit(url).hostname or ""
    in_cluster = host.endswith(f".svc.{DOMAIN}") or host.endswith(".svc")
    if not in_cluster:
        continue
    check(host.split(".")[1:2] == [NS], f"the {what} {host} is in another namespace than {NS}")
    svc = services.get(host.split(".")[0])
    check(svc is not None, f"the {what} {host}: no Service {host.split('.')[0]} rendered")
    if svc is None:
        continue
    port = urlsplit(url).port
    check(
        any(p.get("port") == port for p in svc["spec"].get("ports") or []),
        f"Service {host.split('.')[0]} must serve port {port} ({what})",
    )
    backing = [
        w
        for w in engine_workloads
        if matches({"matchLabels": svc["spec"].get("selector") or {"-": "-"}}, labels_of(w))
    ]
    check(
        len(backing) == 1,
        f"the {what}: Service {host.split('.')[0]} selects {len(backing)} workloads, expected one",
    )
    if what == "S3 store":
        check(bool(bucket_jobs), "the S3 store runs in the cluster: a Job must create the bucket")
        consumers = consumers + [labels_of(j) for j in bucket_jobs]
    for w in backing:
        label = f"{w['kind']} {w['metadata']['name']} ({what})"
        c = pod_of(w)["containers"][0]
        check(
            all(c.get(p) for p in ("readinessProbe", "livenessProbe")),
            f"{label}: needs readiness and liveness probes",
        )
        rules = [
            r
            for p in policies
            if matches(p["spec"].get("podSelector") or {}, labels_of(w))
            for r in p["spec"].get("ingress") or []
        ]
        peers = [x for r in rules for x in r.get("from") or []]
        check(
            bool(rules)
            and all(r.get("from") for r in rules)
            and all(set(x) == {"podSelector"} for x in peers),
            f"{label}: its NetworkPolicies must admit named pods of this namespace only",
        )
        sources = [x["podSelector"] for x in peers if set(x) == {"podSelector"}]
        for want in consumers:
            check(
                any(matches(sel, want) for sel in sources), f"{label}: pods labelled {want} cannot reach it"
            )

# `mwp db upgrade` before a release starts (docs/upgrades.md): a template that never runs by itself.
upgrades = [
    c for c in of_kind("CronJob") if pod_of(c)["containers"][0].get("args", [])[:2] == ["db", "upgrade"]
]
check(len(upgrades) == 1, f"expected one CronJob running `mwp db upgrade`, found {len(upgrades)}")
for c in upgrades:
    check(
        c["spec"].get("suspend") is True,
        f"CronJob {c['metadata']['name']}: must be suspended (a template for jobs)",
    )
    check(
        "MWP_DATABASE_URL" in env_of(pod_of(c)["containers"][0]),
        f"CronJob {c['metadata']['name']}: needs MWP_DATABASE_URL",
    )

for p in problems:
    print(f"FAILED: {p}")
print(f"{count - len(problems)}/{count} checks passed")
sys.exit(1 if problems else 0)
