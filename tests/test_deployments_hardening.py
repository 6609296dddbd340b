"""Deployment manifests: pinned images, container security contexts, network policies."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

DEPLOYMENTS = Path(__file__).resolve().parent.parent / "deployments"


def pods(spec: dict) -> list[dict]:
    return [spec["headGroupSpec"]["template"]] + [g["template"] for g in spec["workerGroupSpecs"]]


def test_every_ray_container_is_locked_down():
    cluster = next(d for d in yaml.safe_load_all((DEPLOYMENTS / "kuberay-raycluster.yaml").read_text())
                   if d["kind"] == "RayCluster")
    job = next(d for d in yaml.safe_load_all((DEPLOYMENTS / "kuberay-rayjob.yaml").read_text())
               if d["kind"] == "RayJob")
    for template in pods(cluster["spec"]) + pods(job["spec"]["rayClusterSpec"]):
        pod = template["spec"]
        assert pod["securityContext"]["runAsNonRoot"] is True
        assert pod["securityContext"]["seccompProfile"] == {"type": "RuntimeDefault"}
        writable = {v["name"] for v in pod["volumes"]}
        for c in pod["containers"]:
            sc = c["securityContext"]
            assert sc["allowPrivilegeEscalation"] is False and sc["capabilities"] == {"drop": ["ALL"]}
            assert sc["readOnlyRootFilesystem"] is True and sc["runAsNonRoot"] is True
            mounts = {m["mountPath"]: m["name"] for m in c["volumeMounts"]}
            # with a read-only root, Ray needs /tmp (sessions), the numba cache and a home
            assert {"/tmp", "/var/cache/streamtree", "/home/ray"} <= set(mounts)
            assert set(mounts.values()) <= writable


def test_the_rayjob_has_a_network_policy_for_its_pods():
    docs = list(yaml.safe_load_all((DEPLOYMENTS / "kuberay-rayjob.yaml").read_text()))
    job = next(d for d in docs if d["kind"] == "RayJob")
    policy = next(d for d in docs if d["kind"] == "NetworkPolicy")
    selector = policy["spec"]["podSelector"]["matchLabels"]
    for template in pods(job["spec"]["rayClusterSpec"]):
        assert selector.items() <= template["metadata"]["labels"].items()
    sources = [f["podSelector"]["matchLabels"] for f in policy["spec"]["ingress"][0]["from"]]
    assert selector in sources  # the cluster's own pods
    assert {"batch.kubernetes.io/job-name": job["metadata"]["name"]} in sources  # the submitter
    assert policy["spec"]["policyTypes"] == ["Ingress"]


def test_container_image_versions_are_pinned_and_match_the_manifests():
    text = (DEPLOYMENTS / "Containerfile").read_text()
    base = re.search(r"^ARG PYTHON_IMAGE=(\S+)$", text, re.M).group(1)
    assert re.fullmatch(r"python:\d+\.\d+\.\d+-slim-\w+(@sha256:[0-9a-f]{64})?", base)
    ray = re.search(r"^ARG RAY_VERSION=(\S+)$", text, re.M).group(1)
    assert '"ray==${RAY_VERSION}"' in text
    for name in ("kuberay-raycluster.yaml", "kuberay-rayjob.yaml"):
        assert f'rayVersion: "{ray}"' in (DEPLOYMENTS / name).read_text()


def test_launcher_comment_names_the_real_flag():
    text = (DEPLOYMENTS / "ray-cluster.yaml").read_text()
    assert "--n-shards" not in text and "--shards" in text
