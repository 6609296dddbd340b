"""The Ray engine: one actor per row shard, on one machine or a cluster.

Documents stay on the actor that holds them. Each sweep puts the
:class:`~streamtree.inference.enumerated.Candidates` into the object store once; every actor runs
the same :func:`~streamtree.inference.enumerated.sweep_rows` as the local engine on its shard with
its own PCG64 stream and sends back its :class:`~streamtree.inference.enumerated.SweepStats`,
which are merged in shard order. Same seeds and shard count, same numbers as
:class:`~streamtree.engines.local.LocalEngine`, bit for bit.

Fault tolerance: after every sweep the engine keeps each shard's stream state (a few integers).
When an actor dies (Ray restarts it up to ``max_restarts`` times, or the engine replaces it once
Ray gives up), the engine re-sends the shard from the object store together with the stream
state as of the start of the interrupted sweep and runs that sweep again, so the epoch ends
exactly as an undisturbed one would. Actors that lost their state between sweeps are detected
by a load generation number carried by every call.

Security: a Ray cluster runs any code submitted to it. A cluster started here listens on
127.0.0.1 only; never expose the ports of a multi-node cluster to an untrusted network.
"""

from __future__ import annotations

import atexit
import logging
import os
import secrets
import signal
import sys
import tempfile
import threading
import time
from contextlib import contextmanager
from typing import Any

import numpy as np

from streamtree.engines.base import Engine, EngineFailure, shard_bounds
from streamtree.engines.ray_shard import ShardWorker
from streamtree.inference.enumerated import Candidates, SweepStats

logger = logging.getLogger(__name__)

_AUTH_MODES = ("disabled", "token")


@contextmanager
def _loopback_only():
    """Make a locally started Ray cluster use 127.0.0.1 for every service.

    On Linux Ray resolves its node address to the routable interface and binds there; with
    ``RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER=0`` it treats the machine as a single-node cluster and
    uses the loopback address. Ray reads the variable once at import, hence the module patch
    when Ray is already imported. Child processes (GCS, raylet) inherit it at start.
    """
    import ray._private.ray_constants as rc

    name = rc.ENABLE_RAY_CLUSTERS_ENV_VAR
    old_env, old_flag = os.environ.get(name), rc.ENABLE_RAY_CLUSTER
    os.environ[name] = "0"
    rc.ENABLE_RAY_CLUSTER = False
    try:
        yield
    finally:
        rc.ENABLE_RAY_CLUSTER = old_flag
        if old_env is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = old_env


@contextmanager
def _signal_handlers_kept():
    """Keep this process's SIGTERM and SIGINT handlers through ``ray.init``.

    ``ray.init`` replaces the SIGTERM handler of the main thread with one that exits at once
    (and its C++ core adds a stack dump), which would take a graceful stop away from the
    command line and the service: they finish the step in progress when told to stop.
    """
    if threading.current_thread() is not threading.main_thread():
        yield  # signal handlers can only be set in the main thread, and Ray leaves them alone
        return
    saved = {sig: signal.getsignal(sig) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in saved.items():
            if handler is not None:  # None: set outside Python, which cannot be restored from here
                # set again even if Python reports it unchanged: Ray's core replaces it below Python
                signal.signal(sig, handler)


def _is_loopback(address: str) -> bool:
    host = address.split("://")[-1].rsplit(":", 1)[0].strip("[]")
    return host in ("127.0.0.1", "localhost", "::1")


def _set_auth_mode(mode: str) -> None:
    """Select Ray's authentication mode for this process and the ones it starts.

    Ray 2.5x+ turns token authentication on by default for a new local cluster (and writes a
    token under the home directory); choosing explicitly makes the behaviour independent of the
    Ray version and of files left by earlier runs. Ray caches the mode at import, so the cached
    configuration is refreshed the way Ray itself does when it enables tokens.
    """
    os.environ["RAY_AUTH_MODE"] = mode
    if "ray._raylet" in sys.modules:
        _reload_ray_config()


def _reload_ray_config() -> None:
    """Make Ray read its configuration (among it the authentication mode) from the environment again."""
    try:
        from ray._raylet import Config

        Config.initialize("")
    except (ImportError, AttributeError):  # a Ray whose internals moved: say so, never silently
        logger.warning("Ray's authentication mode could not be set to %r in this process (ray %s); check the "
                       "cluster's authentication before exposing it", os.environ.get("RAY_AUTH_MODE"),
                       getattr(sys.modules.get("ray"), "__version__", "?"))


#: environment variables the engine may set for a cluster it starts, restored when it is shut down
_SESSION_ENV = ("RAY_AUTH_MODE", "RAY_AUTH_TOKEN", "RAY_USAGE_STATS_ENABLED")


def _connection_id(ray) -> tuple:
    """What tells this process's Ray connection from a later one (after ``ray.shutdown()`` and a
    new ``ray.init``): actor handles of an earlier connection are useless in it."""
    ctx = ray.get_runtime_context()
    try:
        gcs = ctx.gcs_address
    except Exception:  # a Ray Client connection has no GCS address of its own
        gcs = None
    return gcs, ctx.get_job_id()


class _Session:
    """A Ray connection opened by this module (a private local cluster, or a connection to an
    address), shared by all the engines of the process.

    Every engine using it holds it; the last one to let go shuts Ray down, removes the
    private session directory and restores the environment variables set for it. One that was
    never let go (an engine not closed) is ended when the interpreter exits; one shut down by
    someone else, when the next engine connects.
    """

    def __init__(self, saved_env: dict[str, str | None], temp_dir: str | None) -> None:
        self.saved_env = saved_env
        self.temp_dir = temp_dir
        self.connection: tuple | None = None
        self.users = 0
        self.ended = False

    def end(self, ray) -> None:
        """Shut Ray down if it is still this connection; clean up after it (idempotent)."""
        if self.ended:
            return
        self.ended = True
        if ray.is_initialized() and _connection_id(ray) == self.connection:
            ray.shutdown()
        if not ray.is_initialized():
            # (a Ray the caller started after ours went down may run with these settings: kept)
            _restore_env(self.saved_env)
        if self.temp_dir:
            import shutil

            shutil.rmtree(self.temp_dir, ignore_errors=True)


_session: _Session | None = None  # the connection this module opened, while open
_session_lock = threading.RLock()
_exit_hook = False
_token: str | None = None


def _private_token() -> str:
    """The token of the private clusters this process starts: one for the process, as Ray's
    driver keeps the first token it read (a later cluster with another one refuses it)."""
    global _token
    if _token is None:
        _token = secrets.token_hex(32)
    return _token


def _restore_env(saved: dict[str, str | None]) -> None:
    """Put back environment variables as they were (``None``: not set)."""
    mode_before = os.environ.get("RAY_AUTH_MODE")
    for name, value in saved.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    if os.environ.get("RAY_AUTH_MODE") != mode_before and "ray._raylet" in sys.modules:
        _reload_ray_config()  # Ray keeps the mode it read; a later ray.init must see the restored one


def _release(session: _Session) -> None:
    """One engine lets go of ``session``; the last one ends it."""
    import ray

    global _session
    with _session_lock:
        session.users -= 1
        if session.users <= 0:
            session.end(ray)
            if _session is session:
                _session = None


def _end_at_exit() -> None:
    """End the session of engines never closed: Ray's processes go, and so does the private
    session directory, which Ray's own exit hook would leave behind."""
    global _session
    with _session_lock:
        if _session is not None:
            import ray

            _session.end(ray)
            _session = None


class RayEngine(Engine):
    """Runs each row shard in a Ray actor.

    Parameters
    ----------
    n_shards : int
        Number of row shards, one actor each. Results depend on it (as for the local engine),
        not on where the actors run.
    address : str, optional
        Address of an existing cluster (``"auto"``, ``"ray://host:10001"``, ``"host:6379"``).
        Default: the ``RAY_ADDRESS`` environment variable (set inside Ray jobs), else a new local
        single-node cluster: loopback only, no dashboard, no usage statistics. If Ray is already
        initialised in this process, that connection is used whatever ``address`` says. The
        engines of a process share the cluster (or connection) the first of them started; the
        last of them to close shuts it down. A Ray initialised by the caller is never shut down.
    numba_threads : int
        CPUs reserved per actor; also its ``NUMBA_NUM_THREADS`` and ``OMP_NUM_THREADS`` (the
        shard sweep itself is single-threaded today, so more threads only help numba-parallel
        code paths).
    object_store_memory : int, optional
        Object store size in bytes of a locally started cluster.
    max_restarts : int
        Times Ray restarts a dead actor; also the retries of one shard's sweep before giving up.
    actor_options : dict, optional
        Extra ``ray.remote`` options for the actors (e.g. ``{"resources": {"shard": 1}}``); they
        override the defaults (SPREAD scheduling, ``num_cpus=numba_threads``).
    init_kwargs : dict, optional
        Extra keyword arguments for ``ray.init``.
    auth_mode : {"disabled", "token"}, optional
        Ray authentication mode (environment variable ``RAY_AUTH_MODE``). Default: the
        variable's value if set, else ``"token"`` for a local cluster started here (with a
        fresh random token unless ``RAY_AUTH_TOKEN`` or ``RAY_AUTH_TOKEN_PATH`` gives one, and
        its session files in a private 0700 temporary directory) and Ray's own choice when
        connecting to ``address``. With ``"token"`` the token comes from ``RAY_AUTH_TOKEN``,
        ``RAY_AUTH_TOKEN_PATH`` or ``~/.ray/auth_token``.
    ready_timeout : float
        Seconds to wait for the actors to be placed before failing with an explanation.
    """

    def __init__(self, n_shards: int = 1, address: str | None = None, numba_threads: int = 1,
                 object_store_memory: int | None = None, max_restarts: int = 3,
                 actor_options: dict | None = None, init_kwargs: dict | None = None,
                 auth_mode: str | None = None, ready_timeout: float = 300.0) -> None:
        if int(n_shards) < 1:
            raise ValueError(f"n_shards must be >= 1, got {n_shards!r}")
        if int(numba_threads) < 1:
            raise ValueError(f"numba_threads must be >= 1, got {numba_threads!r}")
        if int(max_restarts) < 0:
            raise ValueError(f"max_restarts must be >= 0, got {max_restarts!r}")
        if auth_mode is not None and auth_mode not in _AUTH_MODES:
            raise ValueError(f"auth_mode must be one of {_AUTH_MODES} or None, got {auth_mode!r}")
        for name, opt in (("actor_options", actor_options), ("init_kwargs", init_kwargs)):
            if opt is not None and not isinstance(opt, dict):
                raise ValueError(f"{name} must be a dict, got {type(opt).__name__}")
        self.n_shards = int(n_shards)
        self.address = address
        self.numba_threads = int(numba_threads)
        self.object_store_memory = object_store_memory
        self.max_restarts = int(max_restarts)
        self.actor_options = dict(actor_options or {})
        self.init_kwargs = dict(init_kwargs or {})
        self.auth_mode = auth_mode
        self.ready_timeout = float(ready_timeout)
        self._reset()

    def _reset(self) -> None:
        self._actors: list = []
        self._actor_cls = None
        self._session: _Session | None = None  # the connection of this module that the engine holds
        self._connection: tuple | None = None  # the connection its actors live in
        self._temp_dir: str | None = None  # the private session directory of a cluster started here
        self._shard_refs: list = []
        self._rows = None  # the loaded CSR rows (the driver's copy), for set_values
        self._bounds = None  # shard row bounds
        self._states: list[dict] = []   # each shard's stream state after the last completed sweep
        self._before: list[dict] = []   # ... and before it (for replaying that sweep)
        self._last_cand = None
        self._own: list = []  # per shard: the last sweep's (own columns, adjustments), or None
        self._gen = 0
        self._n_rows = 0
        self.last_sweep_bytes = 0  # array bytes the shards returned in the last sweep

    # ------------------------------------------------------------------ cluster and actors
    def _connect(self):
        """Ray, connected: through this module's open connection, the caller's, or a new one."""
        import ray

        global _session, _exit_hook
        with _session_lock:
            if self._session is not None:  # held since an earlier start that did not finish
                if self._connected(ray):
                    return ray
                self._let_go()
            connection = _connection_id(ray) if ray.is_initialized() else None
            if _session is not None and _session.connection != connection:
                _session.end(ray)  # ours, shut down by someone else: clean up after it
                _session = None
            if connection is not None:
                if _session is not None:
                    _session.users += 1  # another engine's: shared, and ended by the last one
                    self._session, self._temp_dir = _session, _session.temp_dir
                self._connection = connection  # else the caller's: used, never shut down
                return ray
            session = _Session({name: os.environ.get(name) for name in _SESSION_ENV}, None)
            try:
                self._init(ray, session)
                session.connection = _connection_id(ray)
            except BaseException:
                session.end(ray)
                raise
            session.users = 1
            _session = self._session = session
            self._connection, self._temp_dir = session.connection, session.temp_dir
            if not _exit_hook:
                atexit.register(_end_at_exit)  # registered after Ray's own, so it runs first
                _exit_hook = True
        return ray

    def _init(self, ray, session: _Session) -> None:
        """``ray.init``: a new private local cluster, or a connection to the configured address."""
        kwargs: dict[str, Any] = dict(self.init_kwargs)
        # inside a Ray job (`ray job submit`, KubeRay RayJob) RAY_ADDRESS names the cluster
        address = self.address or os.environ.get("RAY_ADDRESS") or None
        if address is None:
            os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")
            mode = self.auth_mode or os.environ.get("RAY_AUTH_MODE") or "token"
            if mode == "token" and not (os.environ.get("RAY_AUTH_TOKEN") or os.environ.get("RAY_AUTH_TOKEN_PATH")):
                # a fresh secret for the private clusters of this process, passed to the processes
                # Ray starts through the environment (nothing written to the home directory)
                os.environ["RAY_AUTH_TOKEN"] = _private_token()
            _set_auth_mode(mode)
            if "_temp_dir" not in kwargs:
                # session files below a directory only this user can enter: Ray makes its temp
                # directory mode 0777 (the default is a shared /tmp/ray), so it goes inside one
                session.temp_dir = tempfile.mkdtemp(prefix="streamtree-ray-")
                kwargs["_temp_dir"] = os.path.join(session.temp_dir, "ray")
            kwargs.setdefault("include_dashboard", False)
            # never fewer CPUs than the actors reserve, or they would wait forever
            kwargs.setdefault("num_cpus", max(os.cpu_count() or 1, self.n_shards * self.numba_threads))
            if self.object_store_memory is not None:
                kwargs.setdefault("object_store_memory", int(self.object_store_memory))
            with _loopback_only(), _signal_handlers_kept():
                # "local": always a new private instance, never another Ray found on this machine
                ray.init(address="local", **kwargs)
            logger.info("started a local Ray cluster (loopback only) with %s CPUs", kwargs["num_cpus"])
        else:
            if self.auth_mode is not None:
                _set_auth_mode(self.auth_mode)
            with _signal_handlers_kept():
                if _is_loopback(address):
                    # a loopback cluster: the driver must take 127.0.0.1 as its own address too
                    with _loopback_only():
                        ray.init(address=address, **kwargs)
                else:
                    ray.init(address=address, **kwargs)
            logger.info("connected to the Ray cluster at %s", address)

    def _connected(self, ray) -> bool:
        """Whether Ray is still the connection this engine's actors live in."""
        return ray.is_initialized() and _connection_id(ray) == self._connection

    def _ray(self):
        """Ray, checked before any call to the actors.

        Ray's calls connect by themselves when Ray is not initialised: they would start a
        default cluster (on a routable address, its files in a shared /tmp/ray) and then fail
        to find the actors. An engine whose connection was shut down says so instead.
        """
        import ray

        if not self._connected(ray):
            raise EngineFailure(
                "the Ray connection holding this engine's shard actors was shut down (ray.shutdown() was called "
                "in this process while a model still used the Ray engine); fit the epoch again (load() starts new "
                "actors), and call ray.shutdown() only after closing the models that use Ray")
        return ray

    def _let_go(self) -> None:
        """Let go of this module's connection, if the engine holds it (the last one ends it)."""
        session, self._session = self._session, None
        if session is not None:
            _release(session)

    def _options(self) -> dict:
        threads = str(self.numba_threads)
        opts: dict[str, Any] = {"num_cpus": self.numba_threads, "scheduling_strategy": "SPREAD",
                                "max_restarts": self.max_restarts, "max_task_retries": 0}
        user = dict(self.actor_options)
        runtime_env = dict(user.pop("runtime_env", None) or {})
        env_vars = {"NUMBA_NUM_THREADS": threads, "OMP_NUM_THREADS": threads}
        env_vars.update(runtime_env.get("env_vars") or {})
        runtime_env["env_vars"] = env_vars
        opts.update(user)
        opts["runtime_env"] = runtime_env
        # the engine replays interrupted sweeps itself; Ray must not re-run them on an empty actor
        opts["max_task_retries"] = 0
        return opts

    def _new_actor(self):
        return self._actor_cls.remote(self.numba_threads)

    def _start(self) -> None:
        ray = self._connect()
        self._actor_cls = ray.remote(ShardWorker).options(**self._options())
        self._actors = [self._new_actor() for _ in range(self.n_shards)]
        try:
            ray.get([a.node_id.remote() for a in self._actors], timeout=self.ready_timeout)
        except ray.exceptions.GetTimeoutError:
            cpus = ray.cluster_resources().get("CPU", 0)
            self.close()
            raise EngineFailure(
                f"{self.n_shards} shard actors needing {self.numba_threads} CPU(s) each were not placed "
                f"within {self.ready_timeout:.0f} s; the cluster has {cpus:g} CPUs. Use fewer shards, "
                f"fewer numba_threads or a bigger cluster.") from None

    # ------------------------------------------------------------------ Engine interface
    def load(self, X, seeds: list[np.random.SeedSequence]) -> None:
        if len(seeds) != self.n_shards:
            raise ValueError(f"{len(seeds)} seeds for {self.n_shards} shards")
        import ray

        if self._actors and not self._connected(ray):
            # every shard is sent again below: new actors in a new connection take them as well
            logger.warning("the Ray connection of the shard actors was shut down; starting new actors")
            self._let_go()
            self._actors = []
        if not self._actors:
            self._start()

        b = shard_bounds(X.shape[0], self.n_shards)
        self._gen += 1
        self._n_rows = X.shape[0]
        self._rows, self._bounds = X, b
        self._shard_refs = [ray.put(X[b[s]:b[s + 1]]) for s in range(self.n_shards)]
        self._states = [np.random.PCG64(s).state for s in seeds]
        self._before = list(self._states)
        self._last_cand = None
        self._own = []
        refs = [a.load.remote(self._shard_refs[s], self._states[s], self._gen)
                for s, a in enumerate(self._actors)]
        for s in range(self.n_shards):
            try:
                ray.get(refs[s])
            except _actor_errors():
                self._reload(s, self._states[s])

    def sweep(self, cand: Candidates, own: np.ndarray | None = None,
              adjust: np.ndarray | None = None) -> SweepStats:
        if not self._shard_refs:
            raise RuntimeError("load() must be called before sweep()")
        ray = self._ray()

        cand_ref = ray.put(cand)
        self._before = list(self._states)
        b = self._bounds
        if own is not None and adjust is None:
            adjust = np.zeros(own.shape[0])
        # each shard gets its rows' own columns and adjustments (16 bytes a row), kept for replays
        self._own = [None if own is None else (own[b[s]:b[s + 1]], adjust[b[s]:b[s + 1]])
                     for s in range(self.n_shards)]
        refs = [a.sweep.remote(cand_ref, self._gen, *self._own_args(s)) for s, a in enumerate(self._actors)]
        parts = []
        for s in range(self.n_shards):
            stats, state = self._result(s, refs[s], cand_ref)
            self._states[s] = state
            parts.append(stats)
        self._last_cand = cand_ref
        # what came back: sparse per-node sums, never K x V (see BENCHMARKS.md for the formula)
        self.last_sweep_bytes = sum(p.nbytes() for p in parts)
        return SweepStats.combine(parts)

    def set_values(self, data: np.ndarray) -> None:
        """Send each shard only its slice of the new values (8 bytes per non-zero); the shard
        rebuilds its rows around them. The shard's rows with these values are put again only
        when an actor must be reloaded (:meth:`_reload`)."""
        if not self._shard_refs:
            raise RuntimeError("load() must be called before set_values()")
        ray = self._ray()

        data = np.asarray(data, dtype=np.float64)
        ptr, b = self._rows.indptr, self._bounds
        values = [data[ptr[b[s]]:ptr[b[s + 1]]] for s in range(self.n_shards)]
        # the rows a reload would send, built only if an actor has to be reloaded
        self._shard_refs = [_DeferredRows(self._rows, b[s], b[s + 1], v) for s, v in enumerate(values)]
        refs = [a.set_values.remote(values[s], self._gen) for s, a in enumerate(self._actors)]
        for s in range(self.n_shards):
            try:
                ok = ray.get(refs[s])
            except _actor_errors():
                ok = False
            if not ok:  # the actor lost its state: send the new rows with the last stream state
                self._reload(s, self._states[s])

    def labels(self) -> np.ndarray:
        if not self._shard_refs:
            return np.zeros(0, dtype=np.int64)
        ray = self._ray()

        out = []
        for s, a in enumerate(self._actors):
            try:
                lab = ray.get(a.labels.remote(self._gen))
            except _actor_errors():
                lab = None
            if lab is None:
                lab = self._recover_labels(s)
            out.append(np.asarray(lab, dtype=np.int64))
        return np.concatenate(out)

    def close(self) -> None:
        """Kill the shard actors; the last engine using a cluster this module started shuts it down."""
        import ray

        if self._actors and self._connected(ray):
            for a in self._actors:
                try:
                    ray.kill(a, no_restart=True)
                except Exception:  # already gone
                    pass
        self._let_go()
        self._reset()

    # ------------------------------------------------------------------ recovery
    def _reload(self, s: int, state: dict) -> None:
        """Send shard ``s`` and a stream state to its actor.

        Waits while Ray restarts the actor (calls to a restarting actor fail at once rather
        than queue) and starts a replacement if Ray has given up on it, up to ``max_restarts + 1``
        replacements. Gives up after ``ready_timeout`` seconds: an actor that cannot be placed
        again (its node left, or other work took the CPUs it had) would otherwise wait forever.
        """
        import ray
        from ray.exceptions import ActorDiedError, GetTimeoutError, RayActorError

        deadline = time.monotonic() + self.ready_timeout
        delay = 0.05
        replaced = 0
        if isinstance(self._shard_refs[s], _DeferredRows):
            self._shard_refs[s] = ray.put(self._shard_refs[s].rows())
        while True:
            left = deadline - time.monotonic()
            if left <= 0:
                raise self._not_back(s)
            try:
                ray.get(self._actors[s].load.remote(self._shard_refs[s], state, self._gen), timeout=left)
                return
            except GetTimeoutError:
                raise self._not_back(s) from None
            except ActorDiedError:
                if replaced > self.max_restarts:
                    raise EngineFailure(f"shard {s}: {replaced} replacement(s) of its actor died before taking the "
                                       "shard; giving up (the Ray workers' logs say why they died)") from None
                replaced += 1
                logger.warning("shard %d: actor is gone for good; starting a replacement", s)
                try:  # never two actors for one shard, should Ray bring the old one back after all
                    ray.kill(self._actors[s], no_restart=True)
                except Exception:  # already gone
                    pass
                self._actors[s] = self._new_actor()
            except RayActorError:  # restarting or temporarily unreachable
                time.sleep(min(delay, left))
                delay = min(2 * delay, 1.0)

    def _not_back(self, s: int) -> EngineFailure:
        """The error for shard ``s``'s actor not running again within ``ready_timeout``."""
        import ray

        try:
            cpus = ray.cluster_resources().get("CPU", 0)
            free = ray.available_resources().get("CPU", 0)
            have = f"the cluster has {cpus:g} CPUs, {free:g} free"
        except Exception:  # the cluster itself is unreachable
            have = "the cluster did not answer"
        need = self._options().get("num_cpus", self.numba_threads)
        return EngineFailure(
            f"shard {s}: its actor was not running again within {self.ready_timeout:g} s (ready_timeout); it needs "
            f"{need:g} CPU(s) and {have}. A node may have left or other work holds the CPUs: add a node or free "
            f"CPUs, use fewer shards or numba_threads, or a longer ready_timeout if nodes are still starting")

    def _result(self, s: int, ref, cand_ref) -> tuple[SweepStats, dict]:
        """Shard ``s``'s sweep result, replaying the sweep after a crash."""
        import ray

        for attempt in range(self.max_restarts + 1):
            try:
                out = ray.get(ref)
            except _actor_errors() as exc:
                logger.warning("shard %d: sweep interrupted (%s); replaying it", s, type(exc).__name__)
                out = None
            if out is not None:
                return out
            if attempt == self.max_restarts:
                break
            self._reload(s, self._before[s])
            ref = self._actors[s].sweep.remote(cand_ref, self._gen, *self._own_args(s))
        raise EngineFailure(f"shard {s}: sweep failed {self.max_restarts + 1} times; giving up")

    def _own_args(self, s: int) -> tuple:
        """Shard ``s``'s own columns and adjustments of the current sweep (none: ``()``)."""
        own = self._own[s] if s < len(self._own) else None
        return () if own is None else own

    def _recover_labels(self, s: int) -> np.ndarray:
        """Rebuild the labels of an actor that lost its state after the last sweep."""
        import ray

        if self._last_cand is None:  # loaded but never swept: nothing to rebuild
            self._reload(s, self._states[s])
            return np.zeros(int(self._bounds[s + 1] - self._bounds[s]), dtype=np.int64)
        logger.warning("shard %d: labels lost; replaying the last sweep", s)
        self._reload(s, self._before[s])
        ref = self._actors[s].sweep.remote(self._last_cand, self._gen, *self._own_args(s))
        _, state = self._result(s, ref, self._last_cand)
        if state != self._states[s]:
            raise RuntimeError(f"shard {s}: replayed sweep diverged from the original")
        return ray.get(self._actors[s].labels.remote(self._gen))

    # ------------------------------------------------------------------ introspection
    def shard_info(self) -> list[dict]:
        """Per shard: node id, process id, sweeps done by the current process, peak memory."""
        ray = self._ray()

        return ray.get([a.info.remote() for a in self._actors])

    def _crash_during_next_sweep(self, s: int) -> None:
        """Fault injection for tests: shard ``s``'s actor dies half-way through the next sweep."""
        ray = self._ray()

        ray.get(self._actors[s].crash_during_next_sweep.remote())

    def __getstate__(self) -> dict:
        # actor handles and object references do not outlive the process; actors restart lazily
        state = {k: v for k, v in self.__dict__.items() if not k.startswith("_")}
        return state

    def __setstate__(self, state: dict) -> None:
        self.__dict__.update(state)
        self._reset()

    def __repr__(self) -> str:
        return (f"RayEngine(n_shards={self.n_shards}, address={self.address!r}, "
                f"numba_threads={self.numba_threads})")


class _DeferredRows:
    """Rows ``lo:hi`` of a CSR matrix with replaced values, built on demand."""

    def __init__(self, X, lo: int, hi: int, values: np.ndarray) -> None:
        self.X, self.lo, self.hi, self.values = X, int(lo), int(hi), values

    def rows(self):
        x = self.X[self.lo:self.hi]
        x.data = np.array(self.values, dtype=np.float64)
        return x


def _actor_errors() -> tuple[type[BaseException], ...]:
    from ray.exceptions import ObjectLostError, RayActorError

    return (RayActorError, ObjectLostError)
