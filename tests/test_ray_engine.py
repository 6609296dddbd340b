"""The Ray engine: parity with the local engine, two nodes on loopback, crash recovery, deployments.

All Ray tests share one module-scoped two-node cluster (head + one worker node, both on
127.0.0.1) started with ``ray.cluster_utils.Cluster``.
"""

from __future__ import annotations

import os
import pickle
import shlex
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from streamtree import DTSSBP
from streamtree.engines.local import LocalEngine
from streamtree.engines.ray import RayEngine, _loopback_only, _set_auth_mode
from streamtree.engines.ray_shard import ShardWorker
from streamtree.synthetic import vmf_tree_corpus

DEPLOYMENTS = Path(__file__).resolve().parents[1] / "deployments"
N_SWEEPS = 5
FIELDS = ("node_ids", "parent", "depth", "mass", "counts", "subtree_counts", "window_counts", "theta",
          "concentration", "born", "assignments", "died")


def corpus_epochs(n_epochs: int = 3) -> list:
    rng = np.random.default_rng(11)
    return [vmf_tree_corpus(rng, p=300, branching=(3, 2), kappa=20.0, beta=400.0, docs_per_node=60).X
            for _ in range(n_epochs)]


def fit(engine, epochs, n_shards=2):
    model = DTSSBP(likelihood="vmf", n_sweeps=N_SWEEPS, max_depth=2, kappa0=100.0, engine=engine, n_shards=n_shards, random_state=0)
    model.fit(epochs)
    return model


def assert_same_trees(a: DTSSBP, b: DTSSBP) -> None:
    assert len(a.trees_) == len(b.trees_)
    for ta, tb in zip(a.trees_, b.trees_):
        for f in FIELDS:
            x, y = getattr(ta, f), getattr(tb, f)
            assert x.shape == y.shape and x.dtype == y.dtype, f
            assert np.array_equal(x, y), f"epoch {ta.epoch}: {f} differs"


@pytest.fixture(scope="module")
def epochs():
    return corpus_epochs()


@pytest.fixture(scope="module")
def local_model(epochs):
    model = fit("local", epochs)
    # the comparison is only meaningful if the tree grew and changed during the run
    assert model.trees_[-1].n_nodes >= 4
    # nodes born in every epoch (each epoch draws new topics, so the identity rule renews most ids)
    assert {int(b) for t in model.trees_ for b in t.born.tolist()} == {0, 1, 2}
    return model


# ---------------------------------------------------------------------------- no cluster needed
def test_shard_worker_replays_a_sweep_from_a_saved_stream_state(epochs, local_model):
    """The actor logic in-process: a reload with the pre-sweep state reproduces the sweep exactly."""
    import ray

    ray_was_up = ray.is_initialized()
    X = epochs[0]
    cand = local_model.predictive_
    seed = np.random.SeedSequence(5)
    ref = LocalEngine(n_shards=1)
    ref.load(X, [seed])
    want = [ref.sweep(cand) for _ in range(3)]

    w = ShardWorker()
    start = np.random.PCG64(seed).state
    w.load(X, start, gen=1)
    assert w.sweep(cand, gen=2) is None and w.labels(gen=2) is None  # stale generation: refuse
    _, s1 = w.sweep(cand, gen=1)
    before = s1
    stats2, s2 = w.sweep(cand, gen=1)
    w2 = ShardWorker()  # a restarted actor: empty, then reloaded with the state before sweep 2
    assert w2.sweep(cand, gen=1) is None
    w2.load(X, before, gen=1)
    replay, s2b = w2.sweep(cand, gen=1)
    assert s2b == s2
    for got in (stats2, replay):
        assert np.array_equal(got.counts, want[1].counts)
        assert np.array_equal(got.sums, want[1].sums)
        assert got.loglik == want[1].loglik
    _, s3 = w2.sweep(cand, gen=1)
    assert np.array_equal(w2.labels(gen=1), ref.labels())
    assert s3 != s2
    assert ray.is_initialized() == ray_was_up  # the worker never starts Ray by itself


def test_engine_validation_and_pickling():
    with pytest.raises(ValueError, match="n_shards"):
        RayEngine(n_shards=0)
    with pytest.raises(ValueError, match="auth_mode"):
        RayEngine(auth_mode="password")
    with pytest.raises(ValueError, match="actor_options"):
        RayEngine(actor_options=["num_cpus"])
    eng = RayEngine(n_shards=3, numba_threads=2, actor_options={"runtime_env": {"env_vars": {"A": "1"}}})
    opts = eng._options()
    assert opts["scheduling_strategy"] == "SPREAD" and opts["num_cpus"] == 2
    assert opts["max_task_retries"] == 0 and opts["max_restarts"] == 3
    assert opts["runtime_env"]["env_vars"] == {"NUMBA_NUM_THREADS": "2", "OMP_NUM_THREADS": "2", "A": "1"}
    back = pickle.loads(pickle.dumps(eng))
    assert back.n_shards == 3 and back._actors == [] and back.actor_options == eng.actor_options


def test_loopback_detection_and_environment_restored():
    import ray._private.ray_constants as rc

    from streamtree.engines.ray import _is_loopback

    assert _is_loopback("127.0.0.1:6379") and _is_loopback("ray://localhost:10001")
    assert _is_loopback("[::1]:6379")
    assert not _is_loopback("auto") and not _is_loopback("10.0.0.5:6379")
    before_env, before_flag = os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"), rc.ENABLE_RAY_CLUSTER
    with _loopback_only():
        assert os.environ["RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER"] == "0" and rc.ENABLE_RAY_CLUSTER is False
        from ray._private.services import get_node_ip_address

        assert get_node_ip_address() == "127.0.0.1"
    assert os.environ.get("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER") == before_env
    assert rc.ENABLE_RAY_CLUSTER == before_flag


# ---------------------------------------------------------------------------- deployments
def test_deployment_manifests_parse_and_carry_what_the_project_relies_on():
    import yaml

    from streamtree.cli import build_parser

    launcher = yaml.safe_load((DEPLOYMENTS / "ray-cluster.yaml").read_text())
    assert launcher["cluster_name"] and launcher["max_workers"] >= 1
    assert "streamtree" in launcher["docker"]["image"]
    assert "--env RAY_AUTH_MODE=token" in launcher["docker"]["run_options"]
    assert any("auth_token" in k for k in launcher["file_mounts"])
    types = launcher["available_node_types"]
    assert launcher["head_node_type"] in types
    assert all(t["resources"]["CPU"] >= 1 for name, t in types.items() if name != launcher["head_node_type"])
    head_start = " ".join(launcher["head_start_ray_commands"])
    assert "ray start --head" in head_start and "--dashboard-host=127.0.0.1" in head_start

    docs = list(yaml.safe_load_all((DEPLOYMENTS / "kuberay-raycluster.yaml").read_text()))
    cluster = next(d for d in docs if d["kind"] == "RayCluster")
    assert cluster["apiVersion"] == "ray.io/v1" and cluster["spec"]["authOptions"]["mode"] == "token"
    assert any(d["kind"] == "NetworkPolicy" for d in docs)
    spec = cluster["spec"]
    assert spec["headGroupSpec"]["serviceType"] == "ClusterIP"
    for g in [spec["headGroupSpec"]] + spec["workerGroupSpecs"]:
        c = g["template"]["spec"]["containers"][0]
        assert "streamtree" in c["image"]
        assert c["resources"]["limits"]["cpu"] and c["resources"]["requests"]["memory"]
    assert spec["workerGroupSpecs"][0]["replicas"] >= 1

    job = next(d for d in yaml.safe_load_all((DEPLOYMENTS / "kuberay-rayjob.yaml").read_text())
               if d["kind"] == "RayJob")
    assert job["kind"] == "RayJob" and job["spec"]["shutdownAfterJobFinishes"] is True
    assert job["spec"]["rayClusterSpec"]["authOptions"]["mode"] == "token"
    argv = shlex.split(job["spec"]["entrypoint"])
    assert argv[:2] == ["streamtree", "replay"]
    args = build_parser().parse_args(argv[1:])  # the entrypoint is valid for the real CLI
    assert args.engine == "ray" and args.n_shards >= 1
    workers = job["spec"]["rayClusterSpec"]["workerGroupSpecs"][0]
    cpus = workers["replicas"] * int(workers["template"]["spec"]["containers"][0]["resources"]["limits"]["cpu"])
    assert args.n_shards <= cpus  # every shard actor can be placed
    head = job["spec"]["rayClusterSpec"]["headGroupSpec"]["template"]["spec"]["containers"][0]
    assert "streamtree" in head["image"] and head["resources"]["limits"]["cpu"]

    containerfile = (DEPLOYMENTS / "Containerfile").read_text()
    assert "pip install ." in containerfile and "ENTRYPOINT" in containerfile


# ---------------------------------------------------------------------------- private clusters (subprocesses)
# These run before the module's shared cluster is started, so that one Ray runs at a time.
def _private_ray_env(home: Path) -> dict:
    """The environment of a subprocess whose engine starts its own cluster: no RAY_ settings of
    ours, and a home directory of the test's own (any file Ray writes under ~ lands there)."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(home)
    return env


def _landing_days(folder: Path, days: range, n: int = 30) -> None:
    from service_corpus import day_rows, write_jsonl

    for d in days:
        write_jsonl(str(folder / f"day{d}.jsonl"), day_rows(d, n, 1))


def _wait_for(predicate, proc: subprocess.Popen, timeout: float, what: str) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, f"the process ended ({proc.returncode}) before {what}"
        assert time.monotonic() < deadline, f"timed out waiting for {what}"
        time.sleep(0.05)


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_to_a_replay_on_ray_says_where_the_store_stands(tmp_path):
    """The Ray engine keeps the command line's SIGTERM handler (``ray.init`` installs its own,
    which exits at once with a stack dump): the replay stops as on the local engine, exit 143
    and where the store stands."""
    _landing_days(tmp_path / "src", range(1, 6))
    store = tmp_path / "store"
    proc = subprocess.Popen([sys.executable, "-m", "streamtree.cli", "replay", str(tmp_path / "src"), "--text-col",
                             "text", "--time-col", "time", "--epoch", "1d", "--min-df", "1", "--max-df", "1.0",
                             "--sweeps", "300", "--engine", "ray", "--shards", "1", "--store", str(store)],
                            stderr=subprocess.PIPE, text=True, env=_private_ray_env(tmp_path), cwd=tmp_path)
    try:
        _wait_for((store / "commits" / "000000.json").exists, proc, 240, "the first commit")
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=240)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 143, err[-3000:]
    assert "streamtree: terminated; the store" in err and "readable through epoch" in err and "--resume" in err
    assert "SIGTERM received" not in err and "Traceback" not in err


@pytest.mark.ray
@pytest.mark.slow
def test_sigterm_to_serve_on_ray_finishes_and_commits_the_epoch(tmp_path):
    """``serve --engine ray`` told to stop mid-epoch finishes and commits that epoch and exits 0,
    as on the local engine."""
    land, store = tmp_path / "land", tmp_path / "store"
    _landing_days(land, range(1, 4))
    log = tmp_path / "serve.log"
    with open(log, "w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "streamtree.cli", "serve", str(land), "--store", str(store),
                                 "--text-col", "text", "--time-col", "time", "--epoch", "1d", "--warmup-docs", "30",
                                 "--min-df", "1", "--poll-interval", "0.3", "--metrics-addr", "off", "--sweeps", "300",
                                 "--engine", "ray", "--shards", "1"],
                                stdout=out, stderr=out, env=_private_ray_env(tmp_path), cwd=tmp_path)
        try:
            # the cluster starts with the first epoch's fit: stop the service inside it
            _wait_for(lambda: "started a local Ray cluster" in log.read_text(), proc, 240, "the Ray cluster")
            proc.send_signal(signal.SIGTERM)
            proc.wait(240)
        finally:
            if proc.poll() is None:
                proc.kill()
    text = log.read_text()
    assert proc.returncode == 0, text[-3000:]
    assert "SIGTERM: stopping (finishing and committing epoch 0" in text
    assert "stopped (SIGTERM): the store is committed through epoch 0" in text
    assert "SIGTERM received" not in text


_TWO_MODELS = """
import json, os
import numpy as np
import ray
from streamtree import DTSSBP
from streamtree.synthetic import vmf_tree_corpus

rng = np.random.default_rng(0)
epochs = [vmf_tree_corpus(rng, p=50, branching=(2,), docs_per_node=20).X for _ in range(2)]
params = dict(likelihood="vmf", n_sweeps=2, max_depth=1, n_shards=1, random_state=0)
local = DTSSBP(**params).fit(epochs)

def same(model):
    return all(np.array_equal(getattr(a, f), getattr(b, f)) for a, b in zip(model.trees_, local.trees_)
               for f in ("node_ids", "theta", "assignments"))

out = {}
a = DTSSBP(**params, engine="ray").partial_fit(epochs[0], epoch=0)
b = DTSSBP(**params, engine="ray").partial_fit(epochs[0], epoch=0)
temp = a._engine._temp_dir  # the cluster's, started by the first model
a.close()
out["up_after_first_close"] = ray.is_initialized()
b.partial_fit(epochs[1], epoch=1)
out["second_continued"] = same(b)
out["addresses"] = sorted({n["NodeManagerAddress"] for n in ray.nodes()})
b.close()
out["down_after_last_close"] = not ray.is_initialized()
out["temp_left"] = os.path.exists(temp)

# Ray shut down under a model: a clear error, never a default cluster started behind its back
c = DTSSBP(**params, engine="ray").partial_fit(epochs[0], epoch=0)
engine, temp = c._engine, c._engine._temp_dir
ray.shutdown()
try:
    engine.labels()
    out["error"] = None
except RuntimeError as exc:
    out["error"] = str(exc)
out["started_by_itself"] = ray.is_initialized()
c.partial_fit(epochs[1], epoch=1)  # the next epoch starts new actors in a new private cluster
out["third_continued"] = same(c)
out["first_temp_left"] = os.path.exists(temp)
c.close()
out["down_at_the_end"] = not ray.is_initialized()
print(json.dumps(out))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_models_share_the_private_cluster_until_the_last_one_closes(tmp_path):
    """Two models on engine="ray" in one process share the cluster the first one started:
    closing one leaves the other working, and the last to close shuts it down. An engine whose
    Ray was shut down by someone else says so, never letting Ray's calls start a default cluster
    (routable address, files in /tmp/ray), and its next epoch starts a private cluster again."""
    import json

    out = subprocess.run([sys.executable, "-c", _TWO_MODELS], env=_private_ray_env(tmp_path), capture_output=True,
                         text=True, timeout=400, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["up_after_first_close"] is True and got["second_continued"] is True
    assert got["addresses"] == ["127.0.0.1"]
    assert got["down_after_last_close"] is True and got["temp_left"] is False
    assert "ray.shutdown() was called" in got["error"] and got["started_by_itself"] is False
    assert got["third_continued"] is True and got["first_temp_left"] is False
    assert got["down_at_the_end"] is True


_REPLACED_BY_THE_CALLERS = """
import json, os, shutil, tempfile
import numpy as np
import ray
from streamtree import DTSSBP
from streamtree.engines.ray import _loopback_only
from streamtree.synthetic import vmf_tree_corpus

X = vmf_tree_corpus(np.random.default_rng(0), p=50, branching=(2,), docs_per_node=20).X
params = dict(likelihood="vmf", n_sweeps=2, max_depth=1, n_shards=1, random_state=0, engine="ray")
first = DTSSBP(**params).partial_fit(X, epoch=0)
temp = first._engine._temp_dir
ray.shutdown()
own = tempfile.mkdtemp()
with _loopback_only():
    ray.init(num_cpus=1, include_dashboard=False, _temp_dir=own)  # the caller's own Ray
second = DTSSBP(**params).partial_fit(X, epoch=0)
out = {"stale_temp_left": os.path.exists(temp), "token_kept": "RAY_AUTH_TOKEN" in os.environ}
first.close()
second.partial_fit(X, epoch=1)  # the caller's Ray still works
second.close()
out["callers_ray_kept"] = ray.is_initialized()
ray.shutdown()
shutil.rmtree(own, ignore_errors=True)
print(json.dumps(out))
"""


@pytest.mark.ray
@pytest.mark.slow
def test_a_private_cluster_replaced_by_the_callers_ray_is_cleaned_up(tmp_path):
    """The caller shuts the engine's private cluster down and starts a Ray of their own: the
    next engine uses that Ray, never shuts it down, and removes the private cluster's session
    directory at once. The settings made for the private cluster stay (the caller's Ray started
    with them, and breaks without its token)."""
    import json

    out = subprocess.run([sys.executable, "-c", _REPLACED_BY_THE_CALLERS], env=_private_ray_env(tmp_path),
                         capture_output=True, text=True, timeout=400, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    got = json.loads(out.stdout.splitlines()[-1])
    assert got["stale_temp_left"] is False and got["token_kept"] is True
    assert got["callers_ray_kept"] is True


_NEVER_CLOSED = """
import numpy as np
from streamtree import DTSSBP
from streamtree.synthetic import vmf_tree_corpus

X = vmf_tree_corpus(np.random.default_rng(0), p=50, branching=(2,), docs_per_node=20).X
model = DTSSBP(likelihood="vmf", n_sweeps=2, max_depth=1, engine="ray", n_shards=1, random_state=0).fit([X])
print(model._engine._temp_dir)
"""


@pytest.mark.ray
def test_the_private_session_directory_goes_at_exit_without_close(tmp_path):
    """A model on engine="ray" never closed: its cluster's session directory is removed when the
    interpreter exits."""
    out = subprocess.run([sys.executable, "-c", _NEVER_CLOSED], env=_private_ray_env(tmp_path), capture_output=True,
                         text=True, timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    temp = Path(out.stdout.splitlines()[-1])
    assert temp.name.startswith("streamtree-ray-")
    assert not temp.exists()


# ---------------------------------------------------------------------------- Ray cluster
@pytest.fixture(scope="module")
def ray_cluster():
    import ray
    from ray.cluster_utils import Cluster

    saved = {k: os.environ.get(k) for k in ("RAY_USAGE_STATS_ENABLED", "RAY_AUTH_MODE")}
    os.environ["RAY_USAGE_STATS_ENABLED"] = "0"
    _set_auth_mode("disabled")
    with _loopback_only():
        cluster = Cluster(initialize_head=True,
                          head_node_args={"num_cpus": 2, "include_dashboard": False})
        cluster.add_node(num_cpus=2)
        cluster.wait_for_nodes()
        ray.init(address=cluster.address)
    try:
        yield cluster
    finally:
        ray.shutdown()
        cluster.shutdown()
        for k, v in saved.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


@pytest.mark.ray
def test_ray_matches_local_bit_for_bit_with_shards_on_both_nodes(ray_cluster, epochs, local_model):
    import ray

    engine = RayEngine(n_shards=2)
    model = fit(engine, epochs)
    assert_same_trees(model, local_model)

    info = engine.shard_info()
    nodes = {n["NodeID"] for n in ray.nodes() if n["Alive"]}
    assert len(nodes) == 2
    assert {i["node_id"] for i in info} == nodes  # SPREAD put one shard on each node
    assert all(i["n_sweeps"] == N_SWEEPS * len(epochs) for i in info)  # and both did every sweep
    # all services of the test cluster are on loopback
    assert {n["NodeManagerAddress"] for n in ray.nodes()} == {"127.0.0.1"}
    engine.close()
    assert engine._actors == []


class CrashingEngine(RayEngine):
    """Kills shard actors at chosen moments: mid-sweep, between sweeps and before labels."""

    def __init__(self, **kw):
        super().__init__(**kw)
        self.calls = 0
        self.epoch_ends = 0

    def sweep(self, cand, own=None, adjust=None):
        import ray

        self.calls += 1
        if self.calls == 2:  # epoch 0: shard 1 dies half-way through its sweep
            self._crash_during_next_sweep(1)
        if self.calls == N_SWEEPS + 3:  # epoch 1: shard 0 killed between two sweeps
            ray.kill(self._actors[0], no_restart=False)
        return super().sweep(cand, own, adjust)

    def labels(self):
        import ray

        self.epoch_ends += 1
        if self.epoch_ends == 2:  # epoch 1: shard 1 loses its labels after the last sweep
            ray.kill(self._actors[1], no_restart=False)
        return super().labels()


@pytest.mark.ray
def test_actors_killed_mid_epoch_give_the_undisturbed_result(ray_cluster, epochs, local_model):
    engine = CrashingEngine(n_shards=2, max_restarts=3)
    model = fit(engine, epochs)
    assert_same_trees(model, local_model)
    pids = [i["pid"] for i in engine.shard_info()]
    assert len(set(pids)) == 2
    # both actors were restarted: neither process has done every sweep of the run
    assert all(i["n_sweeps"] < N_SWEEPS * len(epochs) for i in engine.shard_info())
    engine.close()


@pytest.mark.ray
def test_too_many_crashes_raise_a_clear_error(ray_cluster, epochs):
    engine = RayEngine(n_shards=1, max_restarts=0)
    engine.load(epochs[0], [np.random.SeedSequence(0)])
    fitted = fit("local", epochs[:1], n_shards=1)
    engine._crash_during_next_sweep(0)
    with pytest.raises(RuntimeError, match="sweep failed 1 times"):
        engine.sweep(fitted.predictive_)
    engine.close()


@pytest.mark.ray
def test_a_shard_that_cannot_be_placed_again_fails_within_ready_timeout(ray_cluster, epochs):
    """A shard actor lost for good while other work took every CPU: the replacement cannot be
    placed, and the engine says so after ready_timeout instead of waiting forever."""
    import threading

    import ray

    fitted = fit("local", epochs[:1], n_shards=1)
    engine = RayEngine(n_shards=1, max_restarts=1, ready_timeout=3)
    engine.load(epochs[0], [np.random.SeedSequence(0)])
    ray.kill(engine._actors[0], no_restart=True)
    # the freed CPUs are taken: one 2-CPU actor on each node of the test cluster
    hogs = [ray.remote(ShardWorker).options(num_cpus=2).remote() for _ in range(2)]
    ray.get([h.node_id.remote() for h in hogs], timeout=60)
    # should the engine wait regardless, the CPUs come back after a minute and the test fails
    release = threading.Timer(60, lambda: [ray.kill(h) for h in hogs])
    release.start()
    t0 = time.monotonic()
    try:
        with pytest.raises(RuntimeError, match=r"shard 0: its actor was not running again within 3 s .*"
                                               r"needs 1 CPU\(s\) and the cluster has 4 CPUs, 0 free"):
            engine.sweep(fitted.predictive_)
        assert time.monotonic() - t0 < 30
    finally:
        release.cancel()
        for h in hogs:
            ray.kill(h)
        engine.close()


class _BrokenReplacements(RayEngine):
    """Replacement actors fail in their constructor, as on a node whose environment is broken."""

    started = 0

    def _new_actor(self):
        self.started += 1
        assert self.started < 20, "replacements are started without limit"
        if self._actors:  # a replacement: the constructor fails
            return self._actor_cls.remote("not a number")
        return super()._new_actor()


@pytest.mark.ray
def test_replacement_actors_are_started_a_limited_number_of_times(ray_cluster, epochs):
    fitted = fit("local", epochs[:1], n_shards=1)
    engine = _BrokenReplacements(n_shards=1, max_restarts=1, ready_timeout=60)
    try:
        engine.load(epochs[0], [np.random.SeedSequence(0)])
        import ray

        ray.kill(engine._actors[0], no_restart=True)
        with pytest.raises(RuntimeError, match=r"shard 0: 2 replacement\(s\) of its actor died .*giving up"):
            engine.sweep(fitted.predictive_)
        assert engine.started == 1 + 2
    finally:
        engine.close()


def _bursty_epochs(rng: np.random.Generator, n_epochs: int = 2) -> list:
    """Paragraph-like counts that repeat their words (a document draws its own distribution)."""
    import scipy.sparse as sp

    topics = rng.dirichlet(np.full(60, 0.1), size=4)
    return [sp.csr_matrix(np.array([rng.multinomial(rng.integers(20, 60), rng.dirichlet(5.0 * topics[k] + 1e-3))
                                    for k in range(4) for _ in range(30)], dtype=np.float64))
            for _ in range(n_epochs)]


class _CrashingBursty(RayEngine):
    """Kills shard actors after the likelihood has sent new values: mid-sweep and between sweeps."""

    calls = 0

    def sweep(self, cand, own=None, adjust=None):
        import ray

        self.calls += 1
        if self.calls == 3:  # shard 1 dies half-way through its sweep
            self._crash_during_next_sweep(1)
        if self.calls == 6:  # shard 0 killed between two sweeps, after new values were sent
            ray.kill(self._actors[0], no_restart=False)
        return super().sweep(cand, own, adjust)


@pytest.mark.ray
@pytest.mark.parametrize("crash", [False, True])
def test_bursty_documents_on_ray_match_local(ray_cluster, crash):
    """With ``document_concentration`` the likelihood redraws the rows' values every sweep; the
    engine sends each shard only its values (a reload rebuilds the shard's rows around them), and
    the trees are the local engine's, also with actors killed mid-sweep and between sweeps."""
    epochs = _bursty_epochs(np.random.default_rng(0))
    params = dict(likelihood="multinomial", document_concentration="auto", n_sweeps=4, max_depth=2, n_shards=2,
                  random_state=4)
    local = DTSSBP(**params).fit(epochs)
    engine = (_CrashingBursty if crash else RayEngine)(n_shards=2, max_restarts=3)
    try:
        model = DTSSBP(**params, engine=engine).fit(epochs)
        assert model.state_.hyper["document_concentration"] == local.state_.hyper["document_concentration"]
    finally:
        engine.close()
    if crash:
        assert engine.calls == 8
    assert_same_trees(model, local)


@pytest.mark.ray
def test_weighted_vmf_documents_on_ray_match_local(ray_cluster, epochs):
    """Rows whose norms are document weights (``document_weights=True``) are scored on the shards
    by the weighted path: the trees are the local engine's."""
    import scipy.sparse as sp

    w = np.random.default_rng(5).uniform(0.3, 3.0, size=sum(X.shape[0] for X in epochs))
    weighted, start = [], 0
    for X in epochs:
        weighted.append(sp.csr_matrix(sp.diags(w[start:start + X.shape[0]]) @ X))
        start += X.shape[0]
    params = dict(likelihood="vmf", document_weights=True, n_sweeps=N_SWEEPS, max_depth=2, kappa0=100.0, n_shards=2,
                  random_state=0)
    local = DTSSBP(**params).fit(weighted)
    assert local.trees_[-1].n_nodes >= 4
    engine = RayEngine(n_shards=2)
    try:
        model = DTSSBP(**params, engine=engine).fit(weighted)
    finally:
        engine.close()
    assert_same_trees(model, local)


@pytest.mark.ray
def test_own_node_adjustments_survive_actor_crashes(ray_cluster):
    """Multinomial documents carry their own-node adjustment into every sweep; a shard replayed
    after a crash mid-sweep, between sweeps or before its labels are read gets the same
    adjustments, and the trees are the local engine's."""
    epochs = _bursty_epochs(np.random.default_rng(1))
    params = dict(likelihood="multinomial", n_sweeps=N_SWEEPS, max_depth=2, n_shards=2, random_state=2)
    local = DTSSBP(**params).fit(epochs)
    engine = CrashingEngine(n_shards=2, max_restarts=3)
    try:
        model = DTSSBP(**params, engine=engine).fit(epochs)
    finally:
        engine.close()
    assert engine.calls == 2 * N_SWEEPS and engine.epoch_ends >= 2
    assert_same_trees(model, local)


class _WireChecked(RayEngine):
    """Checks the candidates every sweep puts into the object store for the shards."""

    placeholders = 0

    def sweep(self, cand, own=None, adjust=None):
        import ray

        buffers = []  # the arrays as Ray stores them: out-of-band buffers of pickle protocol 5
        pickle.dumps(cand, protocol=5, buffer_callback=buffers.append)
        wide = [memoryview(b).nbytes for b in buffers if memoryview(b).nbytes >= 8 * cand.dim]
        assert wide == [8 * cand.n_live * cand.dim]  # theta alone: no (P, V) array, no log theta
        got = ray.get(ray.put(cand))  # a shard's copy: what was left out is rebuilt, bit for bit
        for name in ("coef_T", "ph_alpha", "ph_b"):
            assert np.array_equal(getattr(got, name), getattr(cand, name)), name
        self.placeholders += cand.n_placeholders
        return super().sweep(cand, own, adjust)


@pytest.mark.ray
@pytest.mark.parametrize("concentration", [None, "auto"])
def test_multinomial_broadcast_holds_theta_and_no_placeholder_parameters(ray_cluster, concentration):
    """The multinomial's candidates reach the shards as theta, the placeholders' strengths and
    the floor (the vMF's K x V doubles, not (K + P) x V); the shards build the placeholders'
    Dirichlet parameters themselves, and the trees are the local engine's."""
    epochs = _bursty_epochs(np.random.default_rng(2))
    params = dict(likelihood="multinomial", document_concentration=concentration, n_sweeps=N_SWEEPS, max_depth=2,
                  n_shards=2, random_state=1)
    local = DTSSBP(**params).fit(epochs)
    engine = _WireChecked(n_shards=2)
    try:
        model = DTSSBP(**params, engine=engine).fit(epochs)
    finally:
        engine.close()
    assert engine.placeholders > 0
    assert_same_trees(model, local)


_DEFAULT_PATH = """
import json, os, sys
import numpy as np
from streamtree import DTSSBP
from streamtree.synthetic import vmf_tree_corpus
import ray

X = vmf_tree_corpus(np.random.default_rng(0), p=50, branching=(2,), docs_per_node=20).X
model = DTSSBP(likelihood="vmf", n_sweeps=2, max_depth=1, engine="ray", n_shards=2, random_state=0).fit([X])
local = DTSSBP(likelihood="vmf", n_sweeps=2, max_depth=1, engine="local", n_shards=2, random_state=0).fit([X])
same = all(np.array_equal(getattr(a, f), getattr(b, f)) for a, b in zip(model.trees_, local.trees_)
           for f in ("node_ids", "theta", "assignments"))
nodes = ray.nodes()
temp = model._engine._temp_dir
print(json.dumps({"same": same, "addresses": sorted({n["NodeManagerAddress"] for n in nodes}),
                  "gcs": ray.get_runtime_context().gcs_address, "auth": os.environ.get("RAY_AUTH_MODE"),
                  "token": len(os.environ.get("RAY_AUTH_TOKEN", "")), "temp_mode": os.stat(temp).st_mode & 0o777}))
model._engine.close()
print(json.dumps({"shut_down": not ray.is_initialized(), "temp_left": os.path.exists(temp),
                  "env_left": sorted(k for k in ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")
                                     if k in os.environ)}))
"""


@pytest.mark.ray
def test_default_engine_starts_a_private_loopback_cluster(tmp_path):
    """engine="ray" with no address in a fresh process: local Ray on 127.0.0.1 with token auth (a
    fresh token, none written under ~) and its session files in a private directory."""
    import json
    import subprocess
    import sys

    env = {k: v for k, v in os.environ.items() if not k.startswith("RAY_")}
    env["HOME"] = str(tmp_path)  # any file Ray writes under ~ lands here
    out = subprocess.run([sys.executable, "-c", _DEFAULT_PATH], env=env, capture_output=True, text=True,
                         timeout=240, cwd=tmp_path)
    assert out.returncode == 0, out.stderr[-3000:]
    lines = [json.loads(x) for x in out.stdout.splitlines() if x.startswith("{")]
    assert lines[0]["same"] is True
    assert lines[0]["addresses"] == ["127.0.0.1"] and lines[0]["gcs"].startswith("127.0.0.1:")
    assert lines[0]["auth"] == "token" and lines[0]["token"] == 64
    assert lines[0]["temp_mode"] == 0o700
    assert lines[1]["shut_down"] is True and lines[1]["temp_left"] is False
    assert lines[1]["env_left"] == []  # the settings made for the cluster went with it
    assert not (tmp_path / ".ray" / "auth_token").exists()

