"""The writer lease of a snapshot store: one writer at a time, stale leases taken over.

A writer (a replay, the service) creates ``lease.json`` in the store root before it writes
anything, keeps its ``heartbeat`` fresh from a background thread while it works, checks
that the lease is still its own before every commit, and deletes it when done. The lease
names its holder (``owner``, ``host``, ``pid``, ``command``, ``acquired``, ``heartbeat``), so
a second writer is refused with one line saying who holds the store.

A lease is *stale*, and may be taken over, when its heartbeat is older than its
``timeout`` (a writer that hangs or was killed on another machine), or at once when it was
taken on this host by a process that no longer exists (``kill -9``, a crash).

What the file systems guarantee
-------------------------------
* Local paths (and ``file://`` URIs): the lease is created with ``O_CREAT | O_EXCL``, which
  the kernel makes atomic, so of two writers starting together exactly one wins. A stale
  lease is first renamed to a unique name (of two takers only one rename succeeds) and
  then created afresh the same exclusive way. The heartbeat touches the file's mtime, so a
  slow heartbeat can never overwrite a lease someone else took over.
* Object stores and other ``pyarrow.fs`` file systems: pyarrow offers no create-if-absent
  (S3's ``If-None-Match`` and GCS's generation preconditions are not exposed), so the
  lease is written when absent and read back after a settle delay; the writer proceeds
  only if its own token is still there. Object stores give read-after-write consistency
  for single objects (S3 since 2020, GCS always), so this excludes a second writer unless
  both write the lease within the settle delay of each other; the token check before
  every commit then stops the one that lost. Run one writer per store on object stores
  (e.g. a Kubernetes Job with ``parallelism: 1``) and treat the lease as a safety net.
"""

from __future__ import annotations

import errno
import getpass
import json
import logging
import os
import socket
import threading
import time
import uuid
from datetime import datetime, timezone

import pyarrow.fs as pafs

from connectors.stores.errors import CorruptStoreError, StoreAccessError, StoreBusyError, StoreError

logger = logging.getLogger(__name__)

LEASE = "lease.json"
DEFAULT_TIMEOUT = 60.0
#: errors of flushing a file on file systems that do not support it (some FUSE and network ones)
FILE_SYNC_REFUSED = frozenset({errno.EINVAL, errno.ENOTSUP, errno.EOPNOTSUPP})
_SETTLE_SECONDS = 1.0  # object stores: wait before reading the lease back


def _now() -> float:
    return time.time()


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, timezone.utc).isoformat(timespec="seconds")


def _user() -> str:
    try:
        return getpass.getuser()
    except (KeyError, OSError):
        return str(os.getuid()) if hasattr(os, "getuid") else "unknown"


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OSError):
        return True  # exists but belongs to someone else
    return True


def describe(holder: dict) -> str:
    """``alice@host1 pid 4242 (replay since 2026-03-14T10:00:00+00:00, heartbeat 3s ago)``."""
    age = _now() - float(holder.get("heartbeat_unix", 0))
    return (f"{holder.get('owner', '?')}@{holder.get('host', '?')} pid {holder.get('pid', '?')} "
            f"({holder.get('command', '?')} since {holder.get('acquired', '?')}, heartbeat {age:.0f}s ago)")


class Lease:
    """The writer lease of the store rooted at ``root`` on ``fs``; see the module docstring.

    Parameters
    ----------
    fs : pyarrow.fs.FileSystem
    root : str
        The store's root directory (must exist).
    command : str
        What the holder is doing (shown to refused writers).
    timeout : float
        Seconds without a heartbeat after which the lease is stale.
    """

    def __init__(self, fs: pafs.FileSystem, root: str, *, command: str = "write",
                 timeout: float = DEFAULT_TIMEOUT) -> None:
        if not timeout > 0:
            raise ValueError(f"timeout must be > 0, got {timeout!r}")
        self.fs = fs
        self.root = root.rstrip("/")
        self.path = f"{self.root}/{LEASE}"
        self.command = command
        self.timeout = float(timeout)
        self.token = uuid.uuid4().hex
        self.held = False
        self.lost: str | None = None
        self._local = isinstance(fs, pafs.LocalFileSystem)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # ---- content ---------------------------------------------------------------------
    def _record(self) -> dict:
        now = _now()
        return {"owner": _user(), "host": socket.gethostname(), "pid": os.getpid(), "command": self.command,
                "token": self.token, "acquired": _iso(now), "heartbeat": _iso(now), "heartbeat_unix": now,
                "timeout": self.timeout}

    def read(self) -> dict | None:
        """The current lease (None if there is none); ``heartbeat_unix`` includes the file's mtime."""
        try:
            info = self.fs.get_file_info(self.path)
            if info.type == pafs.FileType.NotFound:
                return None
            with self.fs.open_input_stream(self.path) as f:
                raw = f.read()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise StoreAccessError(f"{self.path}: cannot read the writer lease: {exc}") from None
        try:
            holder = json.loads(raw.decode("utf-8"))
            if not isinstance(holder, dict) or not isinstance(holder.get("token"), str):
                raise ValueError("not a lease object")
            beat = float(holder.get("heartbeat_unix", 0))
        except (ValueError, UnicodeDecodeError, TypeError):
            # A torn or foreign file: treat it as a lease with no heartbeat (stale after timeout).
            holder, beat = {"token": "", "owner": "?", "host": "?", "pid": "?", "command": "unreadable lease"}, 0.0
        if info.mtime is not None:
            beat = max(beat, info.mtime.timestamp())
        holder["heartbeat_unix"] = beat
        return holder

    def is_stale(self, holder: dict) -> bool:
        if _now() - float(holder.get("heartbeat_unix", 0)) > float(holder.get("timeout", self.timeout) or self.timeout):
            return True
        pid = holder.get("pid")
        return holder.get("host") == socket.gethostname() and isinstance(pid, int) and not _pid_alive(pid)

    # ---- acquire / release -----------------------------------------------------------
    def acquire(self) -> "Lease":
        """Take the lease or raise :class:`StoreBusyError` naming the holder."""
        for _ in range(5):
            holder = self.read()
            if holder is not None:
                if not self.is_stale(holder):
                    raise StoreBusyError(
                        f"{self.root}: the store is being written by {describe(holder)}; wait for it to finish "
                        f"(or, if that process is gone, remove {self.path})", holder)
                logger.warning("taking over the stale writer lease of %s", describe(holder))
                if not self._set_aside(holder):
                    continue
            if self._create():
                self.held = True
                self._start_heartbeat()
                return self
        holder = self.read() or {}
        raise StoreBusyError(f"{self.root}: could not take the writer lease (held by {describe(holder)})", holder)

    def _create(self) -> bool:
        text = json.dumps(self._record(), sort_keys=True).encode("utf-8")
        if self._local:
            try:
                fd = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
            except FileExistsError:
                return False
            except OSError as exc:
                raise _access(self.path, exc, "create the writer lease") from None
            try:
                os.write(fd, text)
                sync_file(fd, self.path)
            finally:
                os.close(fd)
            return True
        try:
            if self.fs.get_file_info(self.path).type != pafs.FileType.NotFound:
                return False
            with self.fs.open_output_stream(self.path) as f:
                f.write(text)
        except OSError as exc:
            raise _access(self.path, exc, "create the writer lease") from None
        time.sleep(_SETTLE_SECONDS)
        now = self.read()
        return now is not None and now.get("token") == self.token

    def _set_aside(self, seen: dict) -> bool:
        """Remove a stale lease; False if someone else got there first."""
        if not self._local:
            try:
                self.fs.delete_file(self.path)
            except (FileNotFoundError, OSError):
                return False
            return True
        aside = f"{self.root}/.{LEASE}.stale-{uuid.uuid4().hex}"
        try:
            os.rename(self.path, aside)
        except FileNotFoundError:
            return False
        try:
            with open(aside, "rb") as f:
                moved = json.loads(f.read().decode("utf-8"))
        except (OSError, ValueError, UnicodeDecodeError):
            moved = {"token": ""}
        if isinstance(moved, dict) and moved.get("token", "") != seen.get("token", ""):
            # We moved a lease someone took over a moment ago: put it back unless another appeared.
            try:
                os.link(aside, self.path)
            except OSError:
                pass
            os.unlink(aside)
            return False
        os.unlink(aside)
        return True

    def check(self) -> None:
        """Raise :class:`StoreError` unless the lease is still ours (called before every commit)."""
        if not self.held:
            raise StoreError(f"{self.root}: writing needs the store's writer lease")
        if self.lost is None:
            holder = self.read()
            if holder is None or holder.get("token") != self.token:
                self.lost = describe(holder) if holder else "nobody (the lease file was removed)"
        if self.lost is not None:
            raise StoreError(f"{self.root}: this writer lost the store's lease to {self.lost} "
                             "(its heartbeat was late); stop and rerun with --resume")

    def release(self) -> None:
        """Stop the heartbeat and delete the lease if it is still ours."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=5)
        if not self.held:
            return
        self.held = False
        holder = self.read()
        if holder is not None and holder.get("token") == self.token:
            try:
                self.fs.delete_file(self.path)
            except OSError as exc:
                logger.warning("could not remove the writer lease %s: %s", self.path, exc)

    def __enter__(self) -> "Lease":
        return self.acquire() if not self.held else self

    def __exit__(self, *exc) -> None:
        self.release()

    # ---- heartbeat -------------------------------------------------------------------
    def _start_heartbeat(self) -> None:
        self._stop.clear()
        self._thread = threading.Thread(target=self._beat_loop, name="streamtree-lease-heartbeat", daemon=True)
        self._thread.start()

    def _beat_loop(self) -> None:
        while not self._stop.wait(self.timeout / 4):
            try:
                self.beat()
            except Exception as exc:  # noqa: BLE001 - a failed beat is retried; check() decides
                logger.warning("writer lease heartbeat failed: %s", exc)

    def beat(self) -> None:
        """Refresh the heartbeat if the lease is still ours."""
        holder = self.read()
        if holder is None or holder.get("token") != self.token:
            self.lost = describe(holder) if holder else "nobody (the lease file was removed)"
            return
        if self._local:
            os.utime(self.path)
            return
        record = dict(holder)
        now = _now()
        record.update(heartbeat=_iso(now), heartbeat_unix=now)
        tmp = f"{self.root}/.{LEASE}.tmp-{uuid.uuid4().hex}"
        with self.fs.open_output_stream(tmp) as f:
            f.write(json.dumps(record, sort_keys=True).encode("utf-8"))
        self.fs.move(tmp, self.path)


def sync_file(fd: int, path: str) -> None:
    """Flush the open file ``fd`` (at ``path``) to the disk; skipped, with a debug line, where the
    file system does not support it (:data:`FILE_SYNC_REFUSED`), as the OS then offers nothing
    better. Other errors are raised."""
    try:
        os.fsync(fd)
    except OSError as exc:
        if exc.errno not in FILE_SYNC_REFUSED:
            raise
        logger.debug("%s: the file system does not flush files (%s); skipped", path, exc)


def _access(path: str, exc: OSError, what: str) -> StoreAccessError:
    return StoreAccessError(f"{path}: cannot {what}: {os_reason(exc)}")


def os_reason(exc: OSError) -> str:
    """A short reason with what to do for the common operating-system errors."""
    code = getattr(exc, "errno", None)
    if code in (errno.EACCES, errno.EPERM):
        return "permission denied; choose a directory you can write to, or fix its permissions"
    if code == errno.EROFS:
        return "read-only file system; choose a writable location"
    if code in (errno.ENOSPC, errno.EDQUOT):
        return "no space left on the device; free some space and rerun (with --resume if epochs were published)"
    if code in (errno.ENOTDIR, errno.EEXIST):
        return "a file is in the way where a directory is needed; move it or choose another --store"
    return str(exc).strip() or type(exc).__name__


__all__ = ["DEFAULT_TIMEOUT", "LEASE", "CorruptStoreError", "Lease", "describe", "os_reason"]
