"""The service's deployment files: a hardened systemd unit and a Kubernetes Deployment."""

from __future__ import annotations

import shlex
from pathlib import Path

from streamtree.cli import build_parser
from streamtree.service import parse_address

DEPLOYMENTS = Path(__file__).resolve().parents[1] / "deployments"


def _unit(text: str) -> dict[str, dict[str, list[str]]]:
    """A systemd unit as section -> key -> values (keys may repeat)."""
    out: dict[str, dict[str, list[str]]] = {}
    section = None
    for raw in text.splitlines():
        line = raw.strip()
        if not line or line.startswith(("#", ";")):
            continue
        if line.startswith("[") and line.endswith("]"):
            section = out.setdefault(line[1:-1], {})
            continue
        key, sep, value = line.partition("=")
        assert sep and section is not None, f"not a unit line: {raw!r}"
        section.setdefault(key.strip(), []).append(value.strip())
    return out


def _serve_args(argv: list[str]):
    assert argv[:2] == ["streamtree", "serve"] or argv[0].endswith("/streamtree") and argv[1] == "serve", argv
    return build_parser().parse_args(argv[1:])  # valid for the real CLI


def test_systemd_unit_is_hardened_and_runs_the_real_cli():
    unit = _unit((DEPLOYMENTS / "streamtree-serve.service").read_text())
    svc = unit["Service"]
    one = {k: v[-1] for k, v in svc.items()}
    args = _serve_args(shlex.split(one["ExecStart"]))
    assert args.command == "serve" and args.log_format == "json"
    assert parse_address(args.metrics_addr)[0] == "127.0.0.1"  # metrics on loopback only
    assert args.store.startswith("/var/lib/streamtree/")  # inside StateDirectory
    assert one["DynamicUser"] == "yes" and one["StateDirectory"] == "streamtree"
    assert one["NoNewPrivileges"] == "yes" and one["ProtectSystem"] == "strict" and one["ProtectHome"] == "yes"
    assert one["PrivateTmp"] == "yes" and one["CapabilityBoundingSet"] == ""
    assert args.landing in one["ReadOnlyPaths"].split()
    assert one["Restart"] == "on-failure" and one["KillSignal"] == "SIGTERM"
    assert "MemoryDenyWriteExecute" not in svc  # numba needs to execute the code it compiles
    assert unit["Install"]["WantedBy"] == ["multi-user.target"]
    assert "StartLimitBurst" in unit["Unit"]


def test_kubernetes_deployment_runs_one_hardened_writer():
    import yaml

    docs = list(yaml.safe_load_all((DEPLOYMENTS / "k8s-serve.yaml").read_text()))
    dep = next(d for d in docs if d["kind"] == "Deployment")
    assert dep["spec"]["replicas"] == 1 and dep["spec"]["strategy"]["type"] == "Recreate"
    pod = dep["spec"]["template"]["spec"]
    assert pod["securityContext"]["runAsNonRoot"] is True and pod["terminationGracePeriodSeconds"] >= 60
    assert pod["automountServiceAccountToken"] is False
    (c,) = pod["containers"]
    args = _serve_args(c["args"])
    assert args.landing.startswith("s3://") and args.store.startswith("s3://")
    host, port = parse_address(args.metrics_addr)
    assert port == c["ports"][0]["containerPort"]
    for probe in ("livenessProbe", "readinessProbe"):
        assert c[probe]["httpGet"]["path"] == "/healthz"
    sc = c["securityContext"]
    assert sc["allowPrivilegeEscalation"] is False and sc["readOnlyRootFilesystem"] is True
    assert sc["capabilities"]["drop"] == ["ALL"]
    mounts = {m["mountPath"] for m in c["volumeMounts"]}
    assert "/tmp" in mounts and any(e["value"].startswith(tuple(mounts)) for e in c["env"]
                                    if e["name"] == "NUMBA_CACHE_DIR")
    svc = next(d for d in docs if d["kind"] == "Service")
    assert svc["spec"]["type"] == "ClusterIP"
    pol = next(d for d in docs if d["kind"] == "NetworkPolicy")
    assert pol["spec"]["podSelector"]["matchLabels"] == dep["spec"]["selector"]["matchLabels"]
    assert pol["spec"]["ingress"][0]["ports"][0]["port"] == port
