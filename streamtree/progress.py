"""Progress bars for long runs (replay, demo): epochs, and sweeps within the current epoch.

Shown on stderr with tqdm (a small, dependency-free and widely used library that gives rates,
ETAs and nested bars that redraw in place) and only when stderr is a terminal, so logs and
pipes stay clean; ``--quiet`` turns them off. The model reports sweeps through
``DTSSBP.partial_fit(callback=...)`` and does no I/O itself.
"""

from __future__ import annotations

import sys
import time

from tqdm import tqdm

from streamtree.wording import counted

class ReplayProgress:
    """Epoch bar (epochs done, documents/s, live nodes, ETA) and a sweep bar for the current epoch.

    Pass it as ``replay(..., progress=ReplayProgress())``: replay calls :meth:`start_epoch`,
    :meth:`sweep` after each sweep and the object itself after each epoch.
    """

    def __init__(self, stream=None, disable: bool | None = None, mininterval: float = 0.1) -> None:
        self.mininterval = mininterval
        self.stream = stream or sys.stderr
        tty = getattr(self.stream, "isatty", lambda: False)()
        self.disable = (not tty) if disable is None else disable
        self.epochs: tqdm | None = None
        self.sweeps: tqdm | None = None
        self.documents = 0
        self.begun = time.perf_counter()

    def start_epoch(self, index: int, n_epochs: int, label: str, n_documents: int) -> None:
        if self.epochs is None:
            self.epochs = tqdm(total=n_epochs, initial=index, unit="epoch", file=self.stream, disable=self.disable,
                               dynamic_ncols=True, desc="epochs", mininterval=self.mininterval)
        self.epochs.set_description_str(f"epoch {label}")
        if self.sweeps is not None:
            self.sweeps.close()
        self.sweeps = tqdm(total=None, unit="sweep", file=self.stream, disable=self.disable, leave=False,
                           dynamic_ncols=True, desc=f"  {counted(n_documents, 'doc')}", mininterval=self.mininterval)

    def sweep(self, done: int, n_sweeps: int, n_live: int) -> None:
        if self.sweeps is None:
            return
        if self.sweeps.total != n_sweeps:
            self.sweeps.total = n_sweeps
        self.sweeps.set_postfix_str(counted(n_live, "live node"), refresh=False)
        self.sweeps.update(done - self.sweeps.n)

    def __call__(self, p) -> None:  # after each epoch (an EpochProgress)
        self.documents += p.n_documents
        if self.sweeps is not None:
            self.sweeps.close()
            self.sweeps = None
        if self.epochs is None:
            return
        rate = self.documents / max(time.perf_counter() - self.begun, 1e-9)
        self.epochs.set_postfix_str(f"{rate:.0f} docs/s, {counted(p.n_nodes, 'node')}", refresh=False)
        self.epochs.update(1)
        if p.index + 1 >= p.n_epochs:
            self.close()

    def close(self) -> None:
        for bar in (self.sweeps, self.epochs):
            if bar is not None:
                bar.close()
        self.sweeps = self.epochs = None
