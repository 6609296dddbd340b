"""The ``streamtree`` command line: ``replay``, ``serve``, ``show``, ``snapshot``, ``evaluate``, ``report`` and
``assign``.

Errors print one line ``streamtree <command>: error: <what> (<where>): <what to do>``, with
no traceback (``-vv`` shows it). Exit status:

* 0: success;
* 1: an unexpected error (a bug: the traceback is printed, please report it), or a failure
  of the Ray engine: a worker's exception or a lost actor (one line; ``-vv`` shows the traceback);
* 2: bad usage or input: arguments, an unreadable source, missing columns, times that
  cannot be read, every record rejected, a store that holds another run;
* 3: the store is damaged (manifest, commit record or data file) or cannot be written
  (a file in the way, no permission, a read-only or full disk);
* 75: another writer holds the store's lease (try again later);
* 130 / 143: interrupted by SIGINT (Ctrl-C) / SIGTERM; a replay then says up to which
  epoch the store is readable, and ``--resume`` finishes it.

An output pipe closed early (``streamtree show STORE | head``) ends the command quietly with
status 0.
"""

from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import signal
import sys
import threading
import uuid
import warnings
from collections.abc import Iterator, Sequence

import numpy as np

from streamtree.events import merged_deaths
from streamtree.relays import RELAY_LEGEND, RelayReader, TreeColumns, relay_chains
from streamtree.wording import counted

logger = logging.getLogger(__name__)

EXIT_BUG = 1
EXIT_USAGE = 2
EXIT_STORE = 3
EXIT_BUSY = 75
EXIT_INTERRUPTED = 130
EXIT_TERMINATED = 143


class Terminated(KeyboardInterrupt):
    """SIGTERM, raised in the main thread so clean-up runs as for Ctrl-C."""


#: where the JIT compiler's Python frames live (numba's compiler, llvmlite's bindings)
_COMPILER_DIRS = (os.path.join("numba", "core", ""), os.path.join("llvmlite", ""))
#: how long an interrupt that found the compiler running waits before it is delivered again
_INTERRUPT_RETRY_S = 0.05
#: the last signal :func:`_on_interrupt` raised an exception for (see :func:`_interrupt_of`)
_last_signal: int | None = None


def _in_compiler(frame) -> bool:
    """Whether ``frame`` (where a signal found the main thread) is inside the JIT compiler."""
    while frame is not None:
        if any(part in frame.f_code.co_filename for part in _COMPILER_DIRS):
            return True
        frame = frame.f_back
    return False


def _on_interrupt(signum, frame):
    """SIGTERM and SIGINT: raise :class:`Terminated` or ``KeyboardInterrupt`` in the main thread.

    Not while the JIT compiler runs there: it calls Python back from C (llvmlite's object
    cache), which swallows the exception and leaves the compiler broken, and the process then
    crashes (exit -11) instead of saying where the store stands. The signal is delivered again
    a little later, until it finds the compiler done."""
    if _in_compiler(frame):
        retry = threading.Timer(_INTERRUPT_RETRY_S, os.kill, (os.getpid(), signum))
        retry.daemon = True
        retry.start()
        return
    global _last_signal
    _last_signal = signum
    raise Terminated() if signum == signal.SIGTERM else KeyboardInterrupt()


def _interrupt_of(exc: BaseException) -> KeyboardInterrupt | None:
    """The Ctrl-C or SIGTERM behind ``exc``, if any. A signal's exception raised while compiled
    code (numba) runs a Python callback comes back wrapped, as a SystemError whose cause is the
    interrupt; it is still the user's interrupt, not a bug. One raised while Ray waits for
    results comes back as a bare KeyboardInterrupt: it is a SIGTERM if that was the signal."""
    seen = set()
    while exc is not None and id(exc) not in seen:
        if isinstance(exc, KeyboardInterrupt):
            if type(exc) is KeyboardInterrupt and _last_signal == signal.SIGTERM:
                return Terminated()
            return exc
        seen.add(id(exc))
        exc = exc.__cause__ or exc.__context__
    return None


class _HelpFormatter(argparse.ArgumentDefaultsHelpFormatter):
    """Every option's help ends with its default, unless the help already says it."""

    def _get_help_string(self, action):
        text = action.help or ""
        unset = any(action.default is v for v in (None, False, argparse.SUPPRESS))  # is, not ==: 0 == False
        if "default" in text or unset or action.nargs == 0:
            return text
        return super()._get_help_string(action)


class _Parser(argparse.ArgumentParser):
    def __init__(self, *args, **kwargs):
        kwargs.setdefault("formatter_class", _HelpFormatter)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # one line, exit 2 (argparse's default also prints usage)
        self.exit(EXIT_USAGE, f"{self.prog}: error: {message} (see {self.prog} --help)\n")


def _positive_int(text: str) -> int:
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}") from None
    if v < 1:
        raise argparse.ArgumentTypeError(f"expected a positive integer, got {text!r}")
    return v


def _positive_float(text: str) -> float:
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}") from None
    if not v > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text!r}")
    return v


def _window(text: str) -> int | str:
    if text.lower() in ("inf", "all", "none"):
        return "inf"  # an infinite window (None), told apart from "not given"
    try:
        v = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'inf', got {text!r}") from None
    if v < 0:
        raise argparse.ArgumentTypeError(f"expected a non-negative integer or 'inf', got {text!r}")
    return v


def _df(text: str) -> int | float:
    try:
        return int(text)
    except ValueError:
        pass
    try:
        v = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a count or a fraction, got {text!r}") from None
    if not 0 < v <= 1:
        raise argparse.ArgumentTypeError(f"a fraction must be in (0, 1], got {text!r}")
    return v


def _list_of(conv, name: str):
    def parse(text: str):
        items = [t.strip() for t in text.split(",") if t.strip()]
        if not items:
            raise argparse.ArgumentTypeError(f"empty {name} list")
        return _once_each([conv(t) for t in items], name)

    return parse


def _once_each(items: list, name: str) -> list:
    """``items`` if none repeats (a repeat would run and print the same model twice)."""
    twice = sorted({str(x) for x in items if items.count(x) > 1})
    if twice:
        raise argparse.ArgumentTypeError(f"{name} {', '.join(twice)} given more than once")
    return items


def _variant_list(text: str) -> list[str]:
    from streamtree.variants import VARIANTS

    items = [t.strip().lower() for t in text.split(",") if t.strip()]
    bad = [t for t in items if t not in VARIANTS]
    if bad or not items:
        raise argparse.ArgumentTypeError(f"unknown variant(s) {', '.join(bad) or '(none)'}; "
                                         f"choose from {','.join(VARIANTS)}")
    return _once_each(items, "variant")


def _add_source_args(p: argparse.ArgumentParser) -> None:
    from connectors.sources.times import TIME_UNITS
    from streamtree.replay import ReplayConfig

    p.add_argument("source", help="Parquet/Arrow/JSONL/CSV file, directory or dataset")
    p.add_argument("--text-col", required=True, help="column holding the document text")
    p.add_argument("--time-col", help="column holding the document time (timestamp, date, ISO string, year) "
                                      "(default: none; needed unless --epoch-col)")
    p.add_argument("--id-col", help="column holding document ids (default: <file>:<row>)")
    p.add_argument("--epoch-col", help="column holding an explicit integer epoch (with --epoch column) (default: none)")
    p.add_argument("--time-unit", default="auto", choices=TIME_UNITS,
                   help="how numeric times are read (default auto: chosen from the values, and said)")
    p.add_argument("--time-format", help="strptime pattern for time strings that are not ISO 8601, e.g. "
                                         "'%%d/%%m/%%Y' (default: detect common formats like 2017/2/7)")
    p.add_argument("--time-range", default="auto",
                   help="times kept: auto (reject rows far outside the bulk as 'out of range'), all, or "
                        "START..END with years or ISO dates, e.g. 1790..2020")
    _add_format_args(p)
    # None when not given, so that the few-epochs hint can tell the default from a typed value
    p.add_argument("--epoch", help="epoch width: 10y, year, month, 1w (ISO weeks from Monday, labelled by their "
                                   f"Monday), 1d, 1h, column ... (default: {ReplayConfig.epoch})")
    _add_vocabulary_args(p)


def _add_duplicate_texts_arg(p: argparse.ArgumentParser) -> None:
    """``--duplicate-texts``: one definition for replay, serve and evaluate."""
    from streamtree.records import DEFAULT_DUPLICATE_TEXTS, DUPLICATE_TEXTS

    p.add_argument("--duplicate-texts", choices=DUPLICATE_TEXTS, default=DEFAULT_DUPLICATE_TEXTS,
                   help="a row whose text repeats an earlier row's in its epoch: keep (fit it as a document of "
                        "its own; how many is reported: replay's summary, serve's log, evaluate's output) or "
                        "reject (use the first of each text; the others are filed as rejects, or left out of an "
                        "evaluation) or collapse (fit the first of each text once and publish every copy at its "
                        "node: nothing rejected, the counts hold the copies; left out of an evaluation) "
                        f"(default: {DEFAULT_DUPLICATE_TEXTS})")


def _add_format_args(p: argparse.ArgumentParser) -> None:
    """``--format`` and ``--delimiter``: one definition for replay, evaluate, assign and serve."""
    from connectors.sources.files import FORMAT_CHOICES

    p.add_argument("--format", choices=FORMAT_CHOICES,
                   help="file format (default: from the file extension; .tsv is tab-separated CSV)")
    p.add_argument("--delimiter", help="CSV field delimiter, one character or 'tab' (default: ',' or a tab for .tsv)")


def _max_features(text: str) -> int | str | None:
    if text.lower() == "auto":
        return "auto"
    if text.lower() in ("none", "all"):
        return None
    return _positive_int(text)


def _kappa0(text: str) -> float | str:
    """``auto`` (chosen from the data by the likelihood) or a positive number."""
    return "auto" if text.lower() == "auto" else _positive_float(text)


def _document_concentration(text: str) -> float | str | None:
    """``auto`` (sampled with the model), ``none`` (independent tokens) or a positive number."""
    word = text.lower()
    if word == "none":
        return None
    return "auto" if word == "auto" else _positive_float(text)


def _add_vocabulary_args(p: argparse.ArgumentParser, what: str = "") -> None:
    from streamtree import text as defaults

    p.add_argument("--min-df", type=_df, default=defaults.DEFAULT_MIN_DF,
                   help=f"{what}drop terms in fewer documents (count or fraction)")
    p.add_argument("--max-df", type=_df, default=defaults.DEFAULT_MAX_DF,
                   help=f"{what}drop terms in more documents (count or fraction)")
    p.add_argument("--max-features", type=_max_features, default=defaults.DEFAULT_MAX_FEATURES,
                   help=f"{what}keep only the most frequent terms: a number, auto (200 x documents^(1/3), "
                        "between 500 and 20000) or all")
    p.add_argument("--weighting", choices=["tf", "tfidf"], default=defaults.DEFAULT_WEIGHTING,
                   help=f"{what}term weights before L2 normalisation (vmf only)")
    p.add_argument("--unspaced-terms", choices=defaults.UNSPACED_TERMS, default=defaults.DEFAULT_UNSPACED_TERMS,
                   help=f"{what}Chinese and Japanese, written without spaces: bigrams (each pair of neighbouring "
                        "characters is a term) or runs (a whole run of such characters is one term, as "
                        f"pre-segmented text wants) (default: {defaults.DEFAULT_UNSPACED_TERMS})")


#: DTSSBP keyword arguments the model options set (each option's ``dest`` is the parameter's name)
MODEL_OPTIONS = ("likelihood", "variant", "window", "max_depth", "kappa0", "document_concentration",
                 "document_weights", "split_node", "n_sweeps", "random_state", "engine", "n_shards", "n_jobs")


def _add_model_args(p: argparse.ArgumentParser, *, for_evaluate: bool = False) -> None:
    """Model options; an option not given keeps :class:`streamtree.DTSSBP`'s default (shown in
    the help, read from the estimator so that it is written once)."""
    from streamtree.replay import REPLAY_SEED
    from streamtree.text import DEFAULT_LENGTH_POWER
    from streamtree.variants import VARIANTS

    model = _model_defaults()
    keep = argparse.SUPPRESS  # absent from the namespace unless given
    add = p.add_argument

    def option(*names, dest=None, help="", **kw):
        name = dest or names[0].lstrip("-").replace("-", "_")
        default = REPLAY_SEED if name == "random_state" else model.get(name)
        add(*names, **({"dest": dest} if dest else {}), default=keep,
            help=f"{help} (default: {'inf' if name == 'window' and default is None else default})", **kw)

    p = argparse.Namespace(add_argument=option)
    p.add_argument("--likelihood",
                   help="topic family: vmf (tf-idf directions weighted by length, see --weighting and "
                        "--document-weights) or multinomial (word counts, "
                        "Dirichlet links)")
    p.add_argument("--window", type=_window, help="epochs in the stick window (int or inf)")
    if not for_evaluate:
        p.add_argument("--max-depth", type=int, help="deepest node depth, root = 0")
        p.add_argument("--kappa0", type=_kappa0,
                       help="link strength of node parameters to their parent and previous self: a number, or "
                            "auto (chosen from the data)")
        p.add_argument("--variant", choices=VARIANTS, help="the model or a baseline")
        p.add_argument("--seed", dest="random_state", type=int, help="random seed (fixed, so that a replay is reproducible)")
    p.add_argument("--document-concentration", type=_document_concentration, metavar="{auto,S,none}",
                   help="multinomial likelihood: bursty documents, each drawing its own word "
                        "distribution from Dir(S phi) around its node's phi (a word used once is likely "
                        "to come again); auto (S sampled with the model), a number S, or none (tokens "
                        "are independent draws from phi); other likelihoods ignore auto")
    p.add_argument("--document-weights", action=argparse.BooleanOptionalAction,
                   help="vmf likelihood: weigh each document by its length (rows of norm (tokens / median "
                        f"tokens) ** {DEFAULT_LENGTH_POWER:g}, concentration beta w; auto does so too), or with "
                        "--no-document-weights weigh every document the same (unit rows)")
    p.add_argument("--split-node", choices=["fixed", "integrated"],
                   help="split-merge moves: hold the split node's parameter, or integrate it out too "
                        "(exact; finds lumped vMF topics, but more small nodes on short texts)")
    p.add_argument("--sweeps", dest="n_sweeps", type=_positive_int, help="Gibbs sweeps per epoch")
    p.add_argument("--engine", help="where the z-updates run: local or ray")
    p.add_argument("--shards", dest="n_shards", type=_positive_int,
                   help="row shards per epoch (changes results)")
    p.add_argument("--jobs", dest="n_jobs", type=int, help="local engine threads (-1: all CPUs)")


def _model_defaults() -> dict:
    from streamtree.model import DTSSBP

    return DTSSBP().get_params(deep=False)


def _model_options(args) -> dict:
    """The model options given on the command line, by DTSSBP parameter name."""
    out = {k: getattr(args, k) for k in MODEL_OPTIONS if hasattr(args, k)}
    if out.get("window") == "inf":
        out["window"] = None
    return out


#: the commands and their one-line help, in the order ``streamtree --help`` lists them
COMMAND_HELP = {
    "replay": "fit one tree per epoch over a source and publish them to a store",
    "snapshot": "compute a static hierarchy (BHC, coalescent, TMC) of a stored epoch",
    "show": "print the published trees (or one node's lineage)",
    "assign": "assign new documents to the nodes of a stored epoch's tree",
    "report": "write a self-contained HTML report of a store (opens offline)",
    "serve": "run the ingestion service: watch a landing folder, publish epochs as they close",
    "evaluate": "held-out log density and coherence of the dTSSBP and its baselines",
}


def _top_parser() -> tuple[argparse.ArgumentParser, argparse._SubParsersAction]:
    """The ``streamtree`` parser with its own options and an empty set of commands."""
    import streamtree

    parser = _Parser(prog="streamtree", description="Evolving topic trees over time-stamped text (dTSSBP).",
                     epilog="Exit status: 0 success, 1 a bug (traceback printed), 2 bad usage or input, "
                            "3 damaged or unwritable store, 75 store busy (another writer), "
                            "130/143 interrupted (SIGINT/SIGTERM).")
    parser.add_argument("--version", action="version", version=f"streamtree {streamtree.__version__}")
    parser.add_argument("-v", "--verbose", action="count", default=0, help="log progress (serve logs it anyway); -vv: debug")
    return parser, parser.add_subparsers(dest="command", required=True, parser_class=_Parser)


def _summary_parser() -> argparse.ArgumentParser:
    """The parser for a command line that names no command (``--version``, ``--help``, nothing):
    the commands are listed without their options, whose defaults would import the model."""
    parser, sub = _top_parser()
    for name, text in COMMAND_HELP.items():
        sub.add_parser(name, help=text)
    return parser


def _names_command(argv: Sequence[str]) -> bool:
    """Whether ``argv`` names a command (``streamtree``'s own options take no values)."""
    return any(not a.startswith("-") for a in argv)


def build_parser() -> argparse.ArgumentParser:
    from connectors.sources.times import TIME_UNITS
    from streamtree.replay import ReplayConfig

    parser, sub = _top_parser()

    r = sub.add_parser("replay", help=COMMAND_HELP["replay"],
                       description="Replay a source epoch by epoch into a snapshot store.")
    _add_source_args(r)
    _add_duplicate_texts_arg(r)
    _add_model_args(r)
    r.add_argument("--top-words", type=_positive_int, default=ReplayConfig.top_words, help="label words stored per node")
    r.add_argument("--store", required=True, help="snapshot store directory (or pyarrow.fs URI)")
    g = r.add_mutually_exclusive_group()
    g.add_argument("--resume", action="store_true",
                   help="continue an interrupted replay of the same configuration from its last checkpoint")
    g.add_argument("--overwrite", action="store_true",
                   help="replace the store's run (the old one stays readable until the new one commits)")
    r.add_argument("--keep-checkpoints", choices=["latest", "all"], default="latest",
                   help="keep the full model of the latest epoch only (what --resume needs; the store stays "
                        "small) or of every epoch (assign --epoch and load_model for any epoch; a store "
                        "many times larger)")
    r.add_argument("--quiet", action="store_true", help="no progress bars (also off when stderr is not a terminal)")
    r.add_argument("--static", choices=["bhc", "coalescent", "tmc"],
                   help="also store a static hierarchy of each published epoch (static/<method>-<over>.parquet) "
                        "(default: none)")
    r.add_argument("--static-over", choices=["documents", "nodes"], default="documents",
                   help="leaves of the static hierarchy: a sample of the documents or the tree's nodes")
    r.add_argument("--static-max-points", type=_positive_int, default=300,
                   help="at most this many leaves (a seeded random sample above it)")

    n = sub.add_parser("snapshot", help=COMMAND_HELP["snapshot"],
                       description="Fit a static hierarchy of one stored epoch and write it to the store. "
                                   "Over nodes it uses the stored theta; over documents it re-reads the "
                                   "epoch's rows from the source (the stored replay's unless --source) "
                                   "and vectorises them with the stored vocabulary.")
    n.add_argument("store", help="snapshot store directory")
    n.add_argument("--method", required=True, help="bhc, coalescent or tmc")
    n.add_argument("--epoch", required=True, help="epoch index or label")
    n.add_argument("--over", choices=["documents", "nodes"], default="nodes", help="leaves (default nodes)")
    n.add_argument("--max-points", type=_positive_int, default=300, help="at most this many leaves")
    n.add_argument("--source", help="source of the documents (default: the one the store was replayed from; "
                                    "a service's store: its landing folder)")
    n.add_argument("--text-col", help="text column (default: the stored replay's)")
    n.add_argument("--time-col", help="time column (default: the stored replay's)")
    n.add_argument("--seed", type=int, default=0, help="random seed of the sample and the fit")

    s = sub.add_parser("show", help=COMMAND_HELP["show"],
                       description="Print a store's epoch trees like the dTSSBP paper's figures.")
    s.add_argument("store", help="snapshot store directory")
    s.add_argument("--epoch", help="epoch index or label (default: all)")
    s.add_argument("--node", type=int, help="print this node's lineage across epochs (default: the epochs' trees)")
    s.add_argument("--top-words", type=_positive_int, default=ReplayConfig.top_words,
                   help="words per node (at most the words the store kept per node)")
    s.add_argument("--min-docs", type=int, default=0, help="hide nodes with fewer documents in their subtree")
    s.add_argument("--nodes", type=_positive_int, default=10,
                   help="per epoch, show the nodes holding most documents (and their ancestors)")
    s.add_argument("--all", action="store_true", help="every node and every id, uncapped")
    s.add_argument("--static", metavar="METHOD",
                   help="print the stored static snapshots of METHOD (bhc, coalescent, tmc; or e.g. bhc-nodes) "
                        "instead: clusters with their top words (default: the epochs' trees)")

    a = sub.add_parser("assign", help=COMMAND_HELP["assign"],
                       description="Load the model of one stored epoch, vectorise SOURCE's texts with the "
                                   "store's vocabulary and write each document's MAP node, its posterior "
                                   "probability and the document's log predictive density to a Parquet file. "
                                   "Documents with no vocabulary term, and source records that cannot be "
                                   "read, are kept with an empty node and the reason.")
    a.add_argument("store", help="snapshot store directory (or pyarrow.fs URI)")
    a.add_argument("source", help="Parquet/Arrow/JSONL/CSV file, directory or dataset of new documents")
    a.add_argument("--epoch", help="epoch index or label whose tree is used (default: the latest)")
    a.add_argument("-o", "--output", required=True, help="Parquet file to write")
    a.add_argument("--force", action="store_true",
                   help="replace OUTPUT even if it is a file streamtree did not write")
    a.add_argument("--text-col", help="column holding the document text (default: the stored replay's)")
    a.add_argument("--time-col", help="column holding the document time, to check each row's (a row whose time "
                                      "cannot be read is then a reject); times play no part in an assignment, "
                                      "and by default none is read")
    a.add_argument("--id-col", help="column holding document ids (default: the stored replay's, else <file>:<row>)")
    a.add_argument("--time-unit", default="auto", choices=TIME_UNITS,
                   help="how numeric times are read")
    a.add_argument("--time-format", help="strptime pattern for time strings that are not ISO 8601 "
                                         "(default: detect common formats like 2017/2/7)")
    _add_format_args(a)

    rp = sub.add_parser("report", help=COMMAND_HELP["report"],
                        description="Write one HTML file showing the evolving tree over epochs, each epoch's "
                                    "tree, node lineages, static dendrograms and the run summary. plotly.js "
                                    "and the data are inlined: the file needs no network.")
    rp.add_argument("store", help="snapshot store directory (or pyarrow.fs URI)")
    rp.add_argument("-o", "--output", default="report.html", help="HTML file to write (default report.html)")
    rp.add_argument("--force", action="store_true",
                    help="replace OUTPUT even if it is a file streamtree did not write")
    from streamtree.report.data import ReportOptions

    rp.add_argument("--top-words", type=_positive_int, default=ReportOptions.top_words,
                    help="words shown per node (default %(default)s)")
    rp.add_argument("--max-columns", type=_positive_int, default=ReportOptions.max_columns,
                    help="columns of the evolving tree; longer runs group consecutive epochs (default %(default)s)")
    rp.add_argument("--max-bands", type=_positive_int, default=ReportOptions.max_bands,
                    help="offer only fold thresholds showing at most this many bands (default %(default)s)")

    _add_serve_parser(sub)

    e = sub.add_parser(
        "evaluate", help=COMMAND_HELP["evaluate"],
        description="Default protocol 'documents': in every epoch 80/10/10 training/selection/test "
                    "documents, drawn anew for each repeat (each repeat also has its own sampler seed, "
                    "shared by all models, so model differences are paired). kappa0 is chosen per model "
                    "on the selection documents of all epochs, ties within --tie-se standard errors going "
                    "to the estimator's default; the figure is the mean log predictive density per test "
                    "document (epochs weigh by their size) with mean +- sd over repeats, paired "
                    "differences to the first variant, and the NPMI coherence of the largest nodes. "
                    "--protocol paper runs the dTSSBP paper's Table 1 protocol instead (90/10 split per "
                    "epoch; kappa0 and restart chosen on the first half of the epochs, repeats scored on "
                    "the second half) and also prints its unnormalised score.")
    _add_source_args(e)
    _add_duplicate_texts_arg(e)
    _add_model_args(e, for_evaluate=True)
    from streamtree.evaluate import PROTOCOLS, EvaluationConfig

    d = EvaluationConfig()
    keep = argparse.SUPPRESS  # absent unless given: EvaluationConfig's defaults apply
    e.add_argument("--protocol", choices=PROTOCOLS, default=keep,
                   help=f"documents (split by documents) or paper (the paper's Table 1) (default {d.protocol})")
    e.add_argument("--variants", type=_variant_list, default=keep,
                   help=f"comma list of models (default: all six, {','.join(d.variants)})")
    e.add_argument("--max-depth", dest="depths", type=_list_of(int, "depth"), default=keep,
                   help=f"comma list of depths (default {','.join(map(str, d.depths))})")
    e.add_argument("--repeats", type=_positive_int, default=keep,
                   help=f"repeats: new split and seed (documents), new seed (paper) (default {d.repeats})")
    e.add_argument("--kappa0-grid", type=_list_of(_positive_float, "kappa0"), default=keep,
                   help=f"kappa0 values to choose from (default {','.join(f'{k:g}' for k in d.kappa0_grid)})")
    e.add_argument("--restarts", type=_positive_int, default=keep,
                   help=f"seeds per kappa0 in the paper protocol's selection (default {d.restarts})")
    e.add_argument("--seed", type=int, default=keep,
                   help=f"seed of the splits and of the first run (default {d.seed})")
    e.add_argument("--test-fraction", type=float, default=keep,
                   help=f"share of each epoch's documents held out for the score (default {d.test_fraction})")
    e.add_argument("--selection-fraction", type=float, default=keep,
                   help=f"share held out to choose kappa0, documents protocol (default {d.selection_fraction})")
    e.add_argument("--tie-se", type=float, default=keep,
                   help="kappa0 values within this many standard errors of the best count as tied; the "
                        f"one closest to the default kappa0 wins (default {d.tie_se:g})")
    e.add_argument("--max-docs-per-epoch", type=_positive_int, default=None,
                   help="subsample each epoch to at most this many documents (quick runs; default: all)")
    e.add_argument("--max-epochs", type=_positive_int, default=None, help="use only the first N epochs (default: all)")
    e.add_argument("--workers", type=int, default=keep,
                   help="processes fitting the protocol's runs side by side (-1: all CPUs); each run also uses "
                        "--jobs threads, so up to workers x jobs threads are busy; results do not depend on it; "
                        f"local engine only (default {d.workers})")
    e.add_argument("--quiet", action="store_true", help="no progress lines")
    return parser


def _duration(text: str) -> float:
    from streamtree.watermark import parse_duration

    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _duration_or_off(text: str) -> float | None:
    """A duration (:func:`_duration`), or None for ``off``."""
    return None if text.strip().lower() == "off" else _duration(text)


def _add_serve_parser(sub) -> None:
    from connectors.sources.times import TIME_UNITS
    from streamtree.service import ServeConfig
    from streamtree.watermark import format_duration

    v = sub.add_parser(
        "serve", help=COMMAND_HELP["serve"],
        description="Watch a landing folder (local or a pyarrow.fs URI) for new Parquet, Arrow, JSONL or CSV "
                    "files, bucket their rows into event-time epochs, and fit and publish each epoch to the "
                    "store once the watermark (newest event time minus --allowed-lateness) passes its end. "
                    "Each file is ingested once: a ledger committed with each epoch records it. Restarts "
                    "continue from the store. SIGTERM/SIGINT stop after the current step (twice: at once).")
    v.add_argument("landing", help="landing folder or pyarrow.fs URI prefix (s3://bucket/landing/)")
    v.add_argument("--store", required=True, help="snapshot store the service owns (directory or pyarrow.fs URI)")
    v.add_argument("--text-col", required=True, help="column holding the document text")
    v.add_argument("--time-col", required=True, help="column holding the event time")
    v.add_argument("--id-col", help="column holding document ids (default: <file>:<row>)")
    v.add_argument("--id-window", type=_positive_int, default=ServeConfig.id_window, metavar="EPOCHS",
                   help="with --id-col, a row repeating the id of a row waiting in an open epoch or fitted in the "
                        "last EPOCHS published epochs is a 'duplicate id' reject; older ids are forgotten (8 bytes "
                        f"an id) (default {ServeConfig.id_window})")
    v.add_argument("--time-unit", default="auto", choices=TIME_UNITS,
                   help="how numeric times are read")
    v.add_argument("--time-format", help="strptime pattern for time strings that are not ISO 8601, e.g. "
                                         "'%%d/%%m/%%Y' (default: detect common formats like 2017/2/7)")
    _add_format_args(v)
    v.add_argument("--time-range", default="all",
                   help="times kept: all, or START..END with years or ISO dates (rows outside: 'out of range' "
                        "rejects)")
    v.add_argument("--future-tolerance", type=_duration_or_off, default=ServeConfig.future_tolerance,
                   help="how far a row's time may lie after its file landed (clock skew, time zones) before it is a "
                        "'future time' reject: 0, 30m, 2h, 1d, or 'off' for no bound "
                        f"(default {format_duration(ServeConfig.future_tolerance)})")
    v.add_argument("--max-backlog", type=_positive_int, default=ServeConfig.max_backlog, metavar="EPOCHS",
                   help="until the first epoch closes, rows more than this many epochs behind the watermark's epoch "
                        "are 'out of range' rejects, so a stray old row cannot open every epoch since "
                        f"(default {ServeConfig.max_backlog})")
    v.add_argument("--epoch", default="1d", help="epoch width: 1h, 1d, 1w, month, year, 10y ... (default 1d)")
    v.add_argument("--allowed-lateness", type=_duration, default=0.0,
                   help="how late (event time behind the newest) a row may arrive: 0, 30m, 6h, 2d, 1y (default 0)")
    v.add_argument("--late-policy", choices=["reject", "next-epoch"], default="reject",
                   help="a row for a closed epoch: store it as a reject (default) or put it in the next open epoch")
    v.add_argument("--idle-timeout", type=_duration, default=None,
                   help="after no new file landed for this long (counted from when the newest file landed, not from "
                        "a modification time its copy may have kept), close the newest epoch too (default: never)")
    v.add_argument("--poll-interval", type=_duration, default=5.0, help="seconds between listings (default 5s)")
    v.add_argument("--settle", type=_duration, default=None,
                   help="a file this old is complete even if not yet seen on two polls (default 2 poll intervals)")
    v.add_argument("--require-success", action="store_true",
                   help="read a file only once its folder holds a _SUCCESS marker")
    v.add_argument("--vocabulary-from", metavar="STORE",
                   help="use this store's vocabulary (e.g. a replay's) instead of fitting one on a warm-up span "
                        "(default: fit one)")
    v.add_argument("--warmup-docs", type=_positive_int, default=1000,
                   help="fit the vocabulary once the closed epochs hold this many documents (default 1000)")
    _add_vocabulary_args(v, "warm-up vocabulary: ")
    _add_duplicate_texts_arg(v)
    _add_model_args(v)
    v.add_argument("--address", help="Ray cluster address for --engine ray (default: RAY_ADDRESS or a local one)")
    v.add_argument("--top-words", type=_positive_int, default=ServeConfig.top_words, help="label words stored per node")
    v.add_argument("--once", action="store_true",
                   help="take the files that are ready, publish every epoch the watermark closed, exit")
    v.add_argument("--metrics-addr", default="127.0.0.1:9750",
                   help="HOST:PORT for /metrics (Prometheus) and /healthz, or 'off' (default 127.0.0.1:9750)")
    v.add_argument("--log-format", choices=["plain", "json"], default="plain", help="log lines plain or JSON")


# ---------------------------------------------------------------------------------- show
def resolve_epoch(entries: list[dict], text: str) -> dict:
    """The manifest entry for an epoch given by index (``3``) or label (``1840s``)."""
    for e in entries:
        if e.get("label") == text:
            return e
    try:
        idx = int(text)
    except ValueError:
        idx = None
    for e in entries:
        if idx is not None and e["epoch"] == idx:
            return e
    def said(es):
        return ", ".join(f"{e['epoch']} ({e['label']})" for e in es)

    if len(entries) <= 12:
        raise _UserError(f"no published epoch {text!r}", "--epoch", f"use an index or label among: {said(entries)}")
    # Long runs (weekly epochs over years): the span, and the published epochs whose labels
    # sort either side of the one asked for (labels are dates, years or decades, in time order)
    labels = [str(e.get("label")) for e in entries]
    nearest = ""
    if idx is not None:  # an index between published ones (empty epochs are not published)
        indices = [e["epoch"] for e in entries]
        at = bisect.bisect_left(indices, idx)
        nearest = f"; published indices nearest to {idx}: {said(entries[max(at - 1, 0):at + 1])}"
    if (idx is None or len(text) >= 4) and labels == sorted(labels):  # also a year: labels either side
        at = bisect.bisect_left(labels, text)
        near = entries[max(at - 1, 0):at + 1]
        nearest += f"; published labels nearest to {text!r}: {said(near)}"
    raise _UserError(f"no published epoch {text!r}", "--epoch",
                     f"use an index or label among {len(entries)} published epochs: {said(entries[:3])} ... "
                     f"{said(entries[-1:])}{nearest} (streamtree show STORE | grep ^epoch lists them)")


LEGEND = ("* born this epoch, < born by splitting from another node, ^ parent changed; counts are the "
          "epoch's documents in the node's subtree (and at the node itself); words: of word distributions, the "
          "most frequent terms of those documents; of vMF directions, their largest entries; "
          f"[a] > [b]: {RELAY_LEGEND}; relay changes: births, ends and parent changes that only re-draw such a "
          "chain, counted apart and not listed")


def _top_words(top_words: int | None) -> int:
    """``top_words``, or the words a store keeps per node by default."""
    from streamtree.text import DEFAULT_TOP_WORDS

    return DEFAULT_TOP_WORDS if top_words is None else top_words


def _node_words(stored, vocabulary, top_words: int) -> list[list[str]]:
    """Per node, the words the store published (for word distributions the terms of the
    documents in its subtree, ``EpochTree.label_words``; else theta's largest entries), or for
    a store that published none the largest entries of an exactly stored theta."""
    tree = stored.tree
    from_theta = (not any(stored.top_words) and vocabulary is not None and stored.theta_exact
                  and tree.theta.shape[1] == len(vocabulary))
    return tree.top_words(vocabulary, top_words) if from_theta else [w[:top_words] for w in stored.top_words]


def format_epochs(store, entries: list[dict], vocabulary=None, *, previous=None, top_words: int | None = None,
                  min_docs: int = 0, max_nodes: int | None = None, max_ids: int | None = 8) -> Iterator[str]:
    """:func:`format_epoch` of each of ``entries`` (``previous``: the stored epoch before the
    first, if any), a node that dies or merges named by its words from the epoch its subtree
    held the most documents (its last epoch's can be those of a few leftover documents)."""
    peak: dict[int, tuple[int, list[str]]] = {}

    def remember(stored) -> None:
        tree = stored.tree
        for nid, n, w in zip(tree.node_ids.tolist(), tree.subtree_counts.tolist(),
                             _node_words(stored, vocabulary, _top_words(top_words))):
            if w and n >= peak.get(nid, (-1, None))[0]:
                peak[nid] = (n, w)

    if previous is not None:
        remember(previous)
    # after ``previous`` the first epoch is read against the stored epoch before it; else against no tree
    relays = _relays_before(store, entries[0]["epoch"]) if previous is not None and entries else RelayReader()
    for entry in entries:
        stored = store.read(entry["epoch"])
        yield format_epoch(stored, vocabulary, top_words=top_words, min_docs=min_docs,
                           events=store.events(entry["epoch"]), max_nodes=max_nodes, previous=previous,
                           max_ids=max_ids, remembered={k: w for k, (_, w) in peak.items()}, relays=relays)
        remember(stored)
        previous = stored


def _tree_columns(nodes) -> TreeColumns:
    """Ids, parents and the epoch's documents at each node, from a stored ``nodes`` table."""
    return tuple(nodes.column(c).to_numpy() for c in ("id", "parent", "count"))


def _stored_columns(stored) -> TreeColumns:
    """Ids, parents and the epoch's documents at each node of a stored epoch's tree."""
    return stored.tree.node_ids, stored.tree.parent, stored.tree.counts


def _relays_before(store, epoch: int) -> RelayReader:
    """A relay reader that has stepped over every published epoch before ``epoch`` (their node
    tables read in one pass), so that it reads ``epoch`` against the one before it."""
    nodes = store.all_nodes(["epoch", "id", "parent", "count"])
    epochs = nodes.column("epoch").to_numpy()
    columns = _tree_columns(nodes)
    reader = RelayReader()
    for e in np.unique(epochs[epochs < epoch]).tolist():
        rows = epochs == e
        reader.passed(tuple(c[rows] for c in columns))
    return reader


def format_epoch(stored, vocabulary=None, *, top_words: int | None = None, min_docs: int = 0, events=None,
                 max_nodes: int | None = None, previous=None, legend: bool = False, max_ids: int | None = 8,
                 remembered: dict[int, list[str]] | None = None, relays: RelayReader | None = None) -> str:
    """One epoch's tree in the style of the dTSSBP paper's Figures 4 and 5, with what changed.

    One line per node, indented by depth: a mark (``*`` born this epoch, ``<`` split from
    another node, ``^`` parent changed), the node id, the epoch's documents in the node's
    subtree (and at the node itself), and the top words. ``max_nodes`` keeps the nodes holding
    the most documents (with their ancestors, so the shape stays readable), and never a node
    that holds none of the epoch's documents and has no event (a node the window carries over
    from earlier epochs) just to fill the cap; ``min_docs`` hides
    nodes with fewer documents in their subtree. Then the evolution since the previous epoch:
    splits and merges with their words, births and deaths, less the relay changes
    (:func:`~streamtree.relays.relay_changes`: the head line counts them apart, and every id
    keeps its mark; ``relays``, the reader of the epochs before, knows the tree before and the
    ids with a line of their own in earlier epochs, which tells a topic that ended as a relay
    from a relay; it is moved on to this epoch, so pass each epoch once; without it the tree
    before is ``previous``'s) (``previous``, the previous
    :class:`~connectors.stores.snapshot.StoredEpoch`, gives the words of nodes that died or
    merged; ``remembered`` words, where it has a node's, name it instead: a node's words in its
    last epoch can be those of a few leftover documents, and :func:`format_epochs` remembers
    each node's words from the epoch its subtree held the most documents). Id lists are capped at
    ``max_ids`` (None: all). ``legend`` appends :data:`LEGEND`.
    """
    tree = stored.tree
    top_words = _top_words(top_words)
    words = _node_words(stored, vocabulary, top_words)
    prev_words = {}
    if previous is not None:
        pw = _node_words(previous, vocabulary, top_words)
        prev_words = {int(n): pw[i] for i, n in enumerate(previous.tree.node_ids)}
    row = {int(n): i for i, n in enumerate(tree.node_ids)}

    def said(nid: int, *, before: bool = False) -> str:
        if before:
            w = (remembered or {}).get(nid) or prev_words.get(nid)
        else:
            w = words[row[nid]] if nid in row else prev_words.get(nid)
        return f"[{nid}]" + (f" ({' '.join(w[:4])})" if w else "")

    born = [int(n) for n, b in zip(tree.node_ids, tree.born) if b == tree.epoch]
    split_from, moved, merged = {}, {}, []
    for ev in ([] if events is None else events.to_pylist()):
        if ev["event"] == "split_from":
            split_from[ev["node_id"]] = ev["other_id"]
        elif ev["event"] == "parent_changed":
            moved[ev["node_id"]] = ev["other_id"]
        elif ev["event"] == "merged_into":
            merged.append((ev["node_id"], ev["other_id"]))
    n_docs = int(tree.assignments.shape[0])
    merged_ids = {int(a) for a, _ in merged}
    gone = [int(n) for n in tree.died if int(n) not in merged_ids]  # a merge is a node's end: said once, as such
    # every id keeps its mark; the counts and lists leave out the relay changes
    # (relays.relay_changes), which are counted apart
    if relays is None:
        relays = RelayReader(None if previous is None else _stored_columns(previous))
    candidates = [("born", n) for n in born] + [("died", n) for n in gone] + [("split_from", n) for n in split_from] \
        + [("merged_into", n) for n in merged_ids] + [("parent_changed", n) for n in moved]
    flags = relays.read([n for _, n in candidates], [k for k, _ in candidates], _stored_columns(stored))
    relay_only: dict[str, set[int]] = {}
    for (kind, n), flag in zip(candidates, flags.tolist()):
        if flag:
            relay_only.setdefault(kind, set()).add(n)
    n_relay = int(flags.sum())
    born = [n for n in born if n not in relay_only.get("born", ())]
    gone = [n for n in gone if n not in relay_only.get("died", ())]
    said_split = {n: o for n, o in split_from.items() if n not in relay_only.get("split_from", ())}
    merged = [(a, b) for a, b in merged if a not in relay_only.get("merged_into", ())]
    n_moved = len(moved) - len(relay_only.get("parent_changed", ()))
    n_by_split = sum(n in split_from for n in born)  # listed under split: rather than born:
    head = (f"epoch {tree.epoch}" + (f" ({tree.label})" if tree.label else "")
            + f": {counted(n_docs, 'document')}, {counted(tree.n_nodes, 'node')}"
            + (f" ({tree.n_occupied} holding them)" if tree.n_occupied < tree.n_nodes else "")
            + f"; {len(born)} born" + (f" ({n_by_split} by a split)" if n_by_split else "") + f", {len(gone)} died")
    if events is not None:
        head += f", {len(said_split)} split, {len(merged)} merged, {n_moved} changed parent"
    if n_relay:
        head += f" (and {counted(n_relay, 'relay change')})"
    lines = [head]
    marks = ["<" if nid in split_from else "*" if tree.born[k] == tree.epoch else "^" if nid in moved else " "
             for k, nid in enumerate(tree.node_ids.tolist())]
    shown = _shown_nodes(tree, max_nodes, min_docs, {k for k, m in enumerate(marks) if m != " "})
    # a run of relays (no documents of their own, one child) is one line with the node it leads to
    chains = relay_chains(tree.node_ids, tree.parent, tree.counts)
    end_of = {r: end for end, chain in chains.items() for r in chain}
    shown |= {row[end_of[int(tree.node_ids[k])]] for k in shown if int(tree.node_ids[k]) in end_of}
    shown |= {row[r] for k in shown for r in chains.get(int(tree.node_ids[k]), ())}
    level: dict[int, int] = {}  # the indentation of each line: lines above it, relays not counted
    for k in range(tree.n_nodes):
        nid = int(tree.node_ids[k])
        if k not in shown or nid in end_of:
            continue
        path = [*chains.get(nid, ()), nid]
        above = int(tree.parent[row[path[0]]])
        level[nid] = level.get(above, -1) + 1
        ids = " > ".join(f"{marks[row[n]] if i == 0 else marks[row[n]].strip()}[{n}]"
                                   for i, n in enumerate(path))
        splits = [n for n in path if n in split_from]
        note = (f" (split from {split_from[nid]})" if splits == [nid] == path else
                f" ({', '.join(f'{n} split from {split_from[n]}' for n in splits)})" if splits else "")
        lines.append(f"{'    ' * level[nid]}{ids} {counted(int(tree.subtree_counts[k]), 'doc')} "
                     f"({int(tree.counts[k])} here){note}: {' '.join(words[k])}")
    n_hidden = tree.n_nodes - len(shown)
    if n_hidden:
        why = (counted(n_hidden, "smaller or empty node") if max_nodes is not None else
               f"{counted(n_hidden, 'node')} with fewer than {counted(min_docs, 'document')}")
        lines.append(f"  ({why} not shown; --all shows every node)")
    cap = (lambda xs: _capped(xs, max_ids)) if max_ids else (lambda xs: ", ".join(map(str, xs)))
    splits = [f"{said(int(o), before=True) if int(o) in prev_words else f'[{o}]'} -> {said(int(n))}"
              for n, o in said_split.items()]
    if splits:
        lines.append("  split: " + cap(splits))
    if merged:
        lines.append("  merged: " + cap([f"{said(int(a), before=True)} -> {said(int(b))}" for a, b in merged]))
    plain_born = [said(n) for n in born if n not in split_from]
    if plain_born:
        lines.append("  born: " + cap(plain_born))
    died = [said(n, before=True) for n in gone]
    if died:
        lines.append("  died: " + cap(died))
    if legend:
        lines.append(f"  ({LEGEND})")
    return "\n".join(lines)


def _shown_nodes(tree, max_nodes: int | None, min_docs: int, marked: set[int] = frozenset()) -> set[int]:
    """Rows of the nodes to print: the ``max_nodes`` holding most documents, of those holding
    any or ``marked`` (an event this epoch), and their ancestors, with the root (all if None),
    less those whose subtree has fewer than ``min_docs``."""
    rows = [k for k in range(tree.n_nodes) if tree.parent[k] == -1 or tree.subtree_counts[k] >= min_docs]
    if max_nodes is not None:
        held = [k for k in rows if tree.counts[k] > 0 or k in marked]
        biggest = sorted(held, key=lambda k: (-int(tree.counts[k]), k))[:max_nodes]
        row = {int(n): i for i, n in enumerate(tree.node_ids)}
        keep = {k for k in rows if tree.parent[k] == -1}
        for k in biggest:
            while k not in keep:
                keep.add(k)
                if tree.parent[k] == -1:
                    break
                k = row[int(tree.parent[k])]
        return keep
    return set(rows)


def format_evolution(store, entries: list[dict]) -> str:
    """One line for a run: births, deaths, splits, merges and parent changes over ``entries``
    (a node that merged is counted as merged, not as died too), and apart from them the
    relay changes (:func:`~streamtree.relays.relay_changes`)."""
    totals = {"born": 0, "died": 0, "split_from": 0, "merged_into": 0, "parent_changed": 0}
    nodes, n_relay, reader = [], 0, RelayReader()
    for entry in entries:
        ev = store.events(entry["epoch"])
        if ev is None:
            reader.passed(None)  # an epoch without events leaves no tree to read the next one against
        else:
            kinds = ev.column("event").to_pylist()
            node_ids = ev.column("node_id").to_numpy()
            merged_death = merged_deaths(ev.column("epoch").to_numpy(), node_ids, kinds)
            relay = reader.read(node_ids, kinds, _tree_columns(store.nodes(entry["epoch"])))
            for kind, skip, relay_only in zip(kinds, merged_death.tolist(), relay.tolist()):
                if kind in totals and not skip:
                    if relay_only:
                        n_relay += 1
                    else:
                        totals[kind] += 1
        nodes.append(int(entry.get("n_nodes", 0)))
    span = f"{entries[0]['label']} .. {entries[-1]['label']}" if entries else "no epochs"
    relays = f" (and {counted(n_relay, 'relay change')})" if n_relay else ""
    return (f"evolution over {counted(len(entries), 'epoch')} ({span}): {totals['born']} born, {totals['died']} died, "
            f"{totals['split_from']} split, {totals['merged_into']} merged, {totals['parent_changed']} changed "
            f"parent{relays}; nodes per epoch {min(nodes, default=0)} .. {max(nodes, default=0)}")


def format_lineage(store, node_id: int, *, top_words: int | None = None) -> str:
    """One node across epochs: parent, documents and top words in each epoch it was alive."""
    from connectors.stores.snapshot import StoreError

    top_words = _top_words(top_words)
    lineage = store.lineage()
    rec = lineage.get(int(node_id))
    if rec is None:
        raise StoreError(f"{store.uri}: node {node_id} never appears in the published epochs")
    labels = {e["epoch"]: e["label"] for e in store.epochs()}
    vocab = store.vocabulary()
    died = "alive in the last epoch" if rec.died is None else f"gone from epoch {rec.died} ({labels.get(rec.died)})"
    if rec.died is not None:  # a merge is its end: said as such
        into = [e["other_id"] for e in store.events(rec.died).to_pylist()
                if e["node_id"] == int(node_id) and e["event"] == "merged_into"]
        if into:
            died = f"merged into node {into[-1]} in epoch {rec.died} ({labels.get(rec.died)})"
    lines = [f"node {node_id}: born in epoch {rec.born} ({labels.get(rec.born)}), {died}"]
    for ep in rec.epochs:
        stored = store.read(ep)
        k = stored.tree.index_of(node_id)
        words = _node_words(stored, vocab, top_words)[k]
        lines.append(f"  epoch {ep} ({labels.get(ep)}): parent {rec.parents[ep]}, "
                     f"{counted(int(stored.tree.subtree_counts[k]), 'doc')} ({int(stored.tree.counts[k])} here): "
                     f"{' '.join(words)}")
    for ep, old, new in rec.parent_changes:
        lines.append(f"  parent changed at epoch {ep}: {old} -> {new}")
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- commands
def _replay_config(args, model: dict | None = None):
    from streamtree.replay import ReplayConfig

    return ReplayConfig(
        source=args.source, text_col=args.text_col, time_col=args.time_col, id_col=args.id_col,
        epoch_col=args.epoch_col, epoch=ReplayConfig.epoch if args.epoch is None else args.epoch,
        time_unit=args.time_unit, time_format=args.time_format, time_range=args.time_range,
        format=args.format, delimiter=args.delimiter, min_df=args.min_df,
        max_df=args.max_df, max_features=args.max_features, weighting=args.weighting,
        unspaced_terms=args.unspaced_terms, top_words=_top_words(getattr(args, "top_words", None)),
        model=_model_options(args) if model is None else model,
        duplicate_texts=getattr(args, "duplicate_texts", ReplayConfig.duplicate_texts),
    )


def cmd_replay(args) -> int:
    from streamtree.progress import ReplayProgress
    from streamtree.replay import replay

    config = _replay_config(args)
    if config.time_col is None and config.epoch_col is None:
        raise _UserError("give --time-col (or --epoch-col with --epoch column)", "replay", "add the column name")
    mode = "resume" if args.resume else "overwrite" if args.overwrite else "refuse"
    static = None
    if args.static:
        from streamtree.snapshots import StaticOptions

        static = StaticOptions(args.static, args.static_over, args.static_max_points)
    try:
        progress = None if args.quiet else ReplayProgress()
        try:
            summary = replay(config, args.store, mode=mode, progress=progress, static=static,
                             keep_checkpoints=args.keep_checkpoints)
        finally:
            if progress is not None:
                progress.close()
    except BaseException as exc:
        interrupt = _interrupt_of(exc)
        if interrupt is None:
            raise
        sys.stderr.write(f"\nstreamtree: {'terminated' if isinstance(interrupt, Terminated) else 'interrupted'}; "
                         f"{_where_store_stands(args.store)}\n")
        return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
    for note in summary.notes:
        sys.stderr.write(f"note: {note}\n")
    print(summary.format())
    hint = few_epochs_hint(summary.n_epochs, summary.time_span_us, config.epoch, summary.time_resolution,
                           default=args.epoch is None)
    if hint:
        print(f"hint: {hint}")
    print(f"store: {args.store}")
    return 0


def _span_words(us: int) -> str:
    """A duration in microseconds in words: ``"3.2 years"``, ``"6 days"``, ``"5 hours"``."""
    seconds = us / 1e6
    for unit, n in (("year", 365.2425 * 86400), ("day", 86400), ("hour", 3600), ("minute", 60)):
        if seconds >= n:
            x = seconds / n
            shown = f"{x:.1f}".rstrip("0").rstrip(".") if x < 10 else f"{x:.0f}"
            return f"{shown} {unit}{'' if shown == '1' else 's'}"
    return f"{seconds:g} seconds"


def few_epochs_hint(n_epochs: int, time_span_us, epoch: str, resolution: str | None = None, *,
                    default: bool = False, made_by: str = "the replay") -> str | None:
    """What replay and evaluate add when the rows fell into one epoch, or into two while they
    span less than one epoch (they straddle a boundary): so few epochs show no evolution, which
    usually means the ``--epoch`` (by default a decade) is too wide for the data. Says how many
    epochs ``made_by`` made (``default``: the ``--epoch`` was not given), the rows' time span
    (``[first, last]`` in microseconds), and an ``--epoch`` that would make several, none finer
    than what the times are dated to (``resolution``, see
    :func:`streamtree.epochs.time_resolution`); None when the epochs are many enough, are given
    by a column, or the rows carry no times."""
    from streamtree.epochs import EpochSpec, nominal_width_us, suggest_epoch

    try:
        spec = EpochSpec.parse(epoch)
    except (TypeError, ValueError):
        return None
    if spec.kind == "column" or not time_span_us or n_epochs < 1 or n_epochs > 2:
        return None
    first, last = (int(t) for t in time_span_us)
    span = last - first
    if n_epochs == 2 and span >= nominal_width_us(spec):
        return None
    # the ends as finely as shows them apart (and a single time as finely as it is given)
    if span >= 2 * 86_400_000_000:
        unit = "D"
    elif span >= 1_000_000 or (first % 1_000_000 == 0 and last % 1_000_000 == 0):
        unit = "s"
    else:
        unit = "ms" if first % 1000 == 0 and last % 1000 == 0 else "us"
    when = lambda us: str(np.datetime_as_string(np.datetime64(us, "us"), unit=unit))  # noqa: E731
    made = f"{counted(n_epochs, 'epoch')} of --epoch {epoch}{' (the default)' if default else ''}"
    if span == 0:
        return (f"{made_by} made {made}: every document has the same time ({when(first)}), so no --epoch "
                "makes more; check --time-col, or give each document its epoch with --epoch column and --epoch-col")
    said = (f"{made_by} made {made} for documents spanning {_span_words(span)} ({when(first)} .. {when(last)})"
            + (", less than one epoch" if span < nominal_width_us(spec) else "")
            + f", so the trees show {'no' if n_epochs == 1 else 'little'} evolution")
    better = suggest_epoch(first, last, resolution=resolution)
    if better is None:
        return said + "; they lie within a second of one another, which no --epoch separates"
    text, n = better
    return said + f"; --epoch {text} would make {n} epochs (others: year, 10y, month, 3mo, 1w, 1d, 6h, 15min ...)"


def serve_config(args):
    """The :class:`~streamtree.service.ServeConfig` of parsed ``serve`` arguments."""
    from streamtree.service import ServeConfig

    model = _model_options(args)
    if args.address and model.get("engine") != "ray":
        raise _UserError("--address is for the Ray engine", "serve", "add --engine ray or drop --address")
    if args.address:
        model["engine_options"] = {"address": args.address}
    return ServeConfig(
        landing=args.landing, store=args.store, text_col=args.text_col, time_col=args.time_col, id_col=args.id_col,
        time_unit=args.time_unit, epoch=args.epoch, allowed_lateness=args.allowed_lateness,
        late_policy=args.late_policy, idle_timeout=args.idle_timeout, poll_interval=args.poll_interval,
        settle=args.settle, require_success=args.require_success, vocabulary_from=args.vocabulary_from,
        warmup_docs=args.warmup_docs, min_df=args.min_df, max_df=args.max_df, max_features=args.max_features,
        weighting=args.weighting, unspaced_terms=args.unspaced_terms, time_format=args.time_format,
        time_range=args.time_range, future_tolerance=args.future_tolerance, max_backlog=args.max_backlog,
        id_window=args.id_window, format=args.format, delimiter=args.delimiter, top_words=args.top_words,
        model=model, duplicate_texts=args.duplicate_texts)


def cmd_serve(args) -> int:
    from streamtree.service import EXIT_ABANDONED, MetricsAddressError, Service, configure_logging, parse_address

    # a service logs its progress by default; -v adds nothing more to it, -vv the debug lines
    # (each sweep of each epoch), as -vv does for every other command
    configure_logging(args.log_format, logging.DEBUG if args.verbose >= 2 else logging.INFO)
    if args.poll_interval <= 0:
        raise _UserError("--poll-interval must be positive", "serve", "use e.g. 5s")
    config = serve_config(args)
    service = Service(config, metrics_addr=parse_address(args.metrics_addr))
    try:
        summary = service.run(once=args.once)
    except MetricsAddressError as exc:
        raise _UserError(f"cannot listen on {exc.host}:{exc.port} for /metrics and /healthz: {exc.reason}",
                         "--metrics-addr", "choose another --metrics-addr (HOST:PORT) or 'off'") from None
    print(summary.format())
    return EXIT_ABANDONED if summary.abandoned else 0


def _where_store_stands(uri: str) -> str:
    from connectors.stores.snapshot import SnapshotStore, StoreError

    try:
        store = SnapshotStore(uri)
        last = store.last_commit()
    except StoreError as exc:
        return f"the store {uri} cannot be read ({exc})"
    if last is None:
        return f"the store {uri} has no published epoch of this run yet; rerun the same command to start again"
    return (f"the store {uri} is readable through epoch {last['epoch']} ({last['label']}); "
            "rerun with --resume to finish")


def _read_store(uri: str):
    """The snapshot store a reading command (show, snapshot, report, assign) names as its first
    argument, and its published epochs; a local file there is a usage error saying so (these
    commands have no --store), and a store with no published epoch an error saying why."""
    from connectors.stores.snapshot import SnapshotStore, StoreError

    if os.path.isfile(uri):
        raise _UserError(f"{uri} is a file, not a snapshot store", "STORE",
                         "give the folder that replay or serve wrote (their --store)")
    store = SnapshotStore(uri)
    entries = store.epochs()
    if entries:
        return store, entries
    config = store.config() if store.exists() else {}
    if "serve" in config:
        why = ("a service writes it and has published no epoch yet: it fits its vocabulary once --warmup-docs "
               "documents have arrived (default 1000), then publishes each epoch as it closes; its log and "
               "metrics show how far it is")
    elif "replay" in config:
        why = "a replay began it and published no epoch yet (still running, or stopped: --resume continues it)"
    elif "://" not in uri and not os.path.exists(uri):
        why = "no such folder: check the path; a store is the folder replay or serve wrote (their --store)"
    else:
        why = "is this a store? run `streamtree replay` or `streamtree serve` first"
    raise StoreError(f"{uri}: no published epochs ({why})")


def cmd_show(args) -> int:
    from streamtree.replay import unfinished_note

    store, entries = _read_store(args.store)
    note = unfinished_note(store)
    if note is not None:
        print(f"note: {note}\n")
    if args.node is not None:
        print(format_lineage(store, args.node, top_words=args.top_words))
        return 0
    chosen = entries if args.epoch is None else [resolve_epoch(entries, args.epoch)]
    if args.static:
        return _show_static(store, chosen, args)
    vocab = store.vocabulary()
    max_nodes = None if args.all else args.nodes
    previous = None
    if chosen[0]["epoch"] != entries[0]["epoch"]:
        before = [e for e in entries if e["epoch"] < chosen[0]["epoch"]]
        previous = store.read(before[-1]["epoch"]) if before else None
    texts = format_epochs(store, chosen, vocab, previous=previous, top_words=args.top_words,
                          min_docs=args.min_docs, max_nodes=max_nodes, max_ids=None if args.all else 8)
    for i, text in enumerate(texts):
        if i:
            print()
        print(text)
    print()
    if len(chosen) > 1:
        print(format_evolution(store, chosen))
    print(f"({LEGEND})")
    return 0


def _show_static(store, chosen: list[dict], args) -> int:
    """Print the stored static snapshots named by ``--static`` (a method, or ``method-over``)."""
    from streamtree.snapshots import METHODS, format_static

    want = args.static
    if want.split("-")[0] not in METHODS:
        raise _UserError(f"unknown static method {want!r}", "--static", f"choose from {', '.join(METHODS)}")
    def wanted(name: str) -> bool:
        return name == want or name.split("-")[0] == want

    have = sorted({m for e in chosen for m in e.get("static", [])})
    names = [m for m in have if wanted(m)]
    if not names:
        elsewhere = [e["label"] for e in store.epochs() if any(wanted(m) for m in e.get("static", []))]
        hint = (f"stored in epoch{'s' * (len(elsewhere) > 1)} {_capped(elsewhere)}; " if elsewhere
                else f"stored: {', '.join(have)}; " if have else "none stored; ")
        raise _UserError(f"no static snapshot {want!r} in the store"
                         + (f" for epoch {chosen[0]['label']}" if len(chosen) == 1 else ""), "--static",
                         hint + f"compute one with `streamtree snapshot {store.uri} --method {want.split('-')[0]} "
                                "--epoch E`")
    vocab = store.vocabulary()
    missing = []
    for entry in chosen:
        stored = [name for name in names if name in entry.get("static", [])]
        if not stored:  # an epoch counts once, whatever variants (over nodes, over documents) exist
            missing.append(entry["label"])
        for name in stored:
            snap = store.read_static(entry["epoch"], name)
            print(f"epoch {entry['epoch']} ({entry['label']}) static {name}: "
                  + format_static(snap, store=store, entry=entry, vocabulary=vocab, top_words=args.top_words,
                                  full=args.all))
    if missing:
        print(f"({want} not computed for {len(missing)} of {counted(len(chosen), 'epoch')}: {_capped(missing)})")
    return 0


def _capped(items, limit: int = 8) -> str:
    """``a, b, c ... (+N more)``: lists of ids and labels are capped in output."""
    items = [str(i) for i in items]
    return ", ".join(items[:limit]) + (f" ... (+{len(items) - limit} more)" if len(items) > limit else "")


#: how a file of each kind streamtree writes shows it is streamtree's: the report's generator
#: tag near the top of the page, and the assignments' Parquet metadata key
_OUTPUT_MARK = {"report": b'<meta name="generator" content="streamtree', "assignments": b"streamtree.assign"}


def _written_by_us(path: str, kind: str) -> bool:
    try:
        if kind == "assignments":
            import pyarrow.parquet as pq

            return _OUTPUT_MARK[kind] in (pq.read_schema(path).metadata or {})
        with open(path, "rb") as f:
            return _OUTPUT_MARK[kind] in f.read(4096)
    except (OSError, ValueError):  # unreadable, or not that format (Arrow's errors are these): not ours
        return False


def _check_output(path: str, kind: str, store: str, inputs: tuple[str, ...] = (), force: bool = False) -> None:
    """Before any work: refuse an ``-o`` that would go over what the command reads or what
    someone else wrote. The output may not be a folder, one of the inputs, or inside the store;
    its folder must exist; an existing file is replaced only if streamtree wrote it (a report or
    assignments of an earlier run), or with --force."""
    example, format_ = {"report": ("report.html", "HTML"), "assignments": ("assignments.parquet", "Parquet")}[kind]
    if os.path.isdir(path):
        raise _UserError(f"{path} is a folder", "-o/--output",
                         f"name the {format_} file to write, e.g. {os.path.join(path, example)}")
    folder = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(folder):
        raise _UserError(f"{folder}: no such folder", "-o/--output",
                         "create it first, or name a file in another folder")
    from connectors.sources.files import canonical_uri

    real = os.path.realpath(path)
    for source in inputs:  # compared as local real paths; a remote URI is never where -o writes
        where = canonical_uri(source)
        if real == where:
            raise _UserError(f"{path} is the input {source}", "-o/--output",
                             "name another file: the output would go over what the command reads")
        if os.path.isdir(where) and real.startswith(where + os.sep):
            raise _UserError(f"{path} is inside the input folder {source}", "-o/--output",
                             "write it outside: a later read of that folder would take it for documents")
    root = canonical_uri(store)
    if "://" not in root:
        if real == root or real.startswith(root + os.sep):
            raise _UserError(f"{path} is inside the store {store}", "-o/--output",
                             f"write it outside the store, e.g. {example} in the current folder")
    if os.path.exists(path) and not force and not _written_by_us(path, kind):
        raise _UserError(f"{path} exists and is not a file streamtree wrote", "-o/--output",
                         "name another file, or pass --force to replace it")


def cmd_report(args) -> int:
    from streamtree.report import ReportOptions, write_report

    _check_output(args.output, "report", args.store, force=args.force)
    store, _ = _read_store(args.store)
    options = ReportOptions(top_words=args.top_words, max_columns=args.max_columns, max_bands=args.max_bands,
                            readable_bands=min(ReportOptions.readable_bands, args.max_bands))
    path = write_report(store, args.output, options)
    print(f"report: {path} ({path.stat().st_size / 1e6:.1f} MB; open it in a browser, no network needed)")
    return 0


def cmd_snapshot(args) -> int:
    from streamtree.snapshots import METHODS, document_directions, snapshot_name, static_snapshot

    if args.method not in METHODS:
        raise _UserError(f"unknown method {args.method!r}", "--method", f"choose from {', '.join(METHODS)}")
    store, entries = _read_store(args.store)
    entry = resolve_epoch(entries, args.epoch)
    stored = store.read(entry["epoch"])
    rng = np.random.default_rng([args.seed, int(entry["epoch"])])
    if args.over == "nodes":
        if not stored.theta_exact:
            logger.info("node parameters are stored compactly (error %.3g: %s); the hierarchy over nodes uses "
                        "them", stored.theta_error, "largest |log p| change of a word" if stored.theta_log_step
                        else "largest relative L2 error of a direction")
        res = static_snapshot(args.method, node_theta=stored.tree.theta, ids=stored.tree.node_ids.tolist(),
                              max_points=args.max_points, rng=rng)
    else:
        X = document_directions(_stored_epoch_rows(store, entry, stored, args))
        res = static_snapshot(args.method, X, ids=stored.doc_ids.tolist(), labels=stored.tree.assignments,
                              max_points=args.max_points, rng=rng)
    name = snapshot_name(args.method, args.over)
    store.write_static(entry["epoch"], name, res.dendrogram, res.stats, leaf_ids=res.leaf_ids)
    h = res.dendrogram.heights
    st = res.stats
    sample = f" (a sample of {st['n_total']})" if st["sampled"] else ""
    line = (f"epoch {entry['epoch']} ({entry['label']}) {args.method} over {args.over}: "
            f"{counted(st['n_points'], 'leaf', 'leaves')}"
            f"{sample}, {st['components']} SVD dims, heights {h.min():.4g} .. {h.max():.4g}")
    if "dtssbp_purity" in st:
        line += f", dendrogram purity vs dTSSBP nodes {st['dtssbp_purity']:.3f}"
    print(line)
    print(f"stored: {args.store} epoch {entry['epoch']} static/{name}.parquet "
          f"(see it with: streamtree show {args.store} --epoch {entry['epoch']} --static {name})")
    return 0


def _stored_epoch_rows(store, entry: dict, stored, args):
    """The stored epoch's documents re-read from the source, vectorised with the stored vocabulary,
    in the stored document order."""
    from connectors.stores.snapshot import StoreError
    from streamtree.replay import ReplayConfig, open_epochs, source_changes

    stored_config = store.config()
    # a replay's settings, or a service's (its columns, time reading and epochs; the source is
    # the landing folder, which the service does not record)
    base = dict(stored_config.get("replay") or stored_config.get("serve") or {})
    fields = set(ReplayConfig.__dataclass_fields__)
    base = {k: v for k, v in base.items() if k in fields and k != "model"}
    for name in ("source", "text_col", "time_col"):
        if getattr(args, name):
            base[name] = getattr(args, name)
    if stored_config.get("serve") and not stored_config.get("replay") and "time_range" not in base:
        # a service keeps every time by default and rejects stray ones as they come; read back the
        # span of its published epochs (a replay's automatic range could drop its first or last)
        from datetime import timedelta

        from streamtree.epochs import EpochSpec

        spec = EpochSpec.parse(base.get("epoch", "1d"))
        keys = [e["key"] for e in store.epochs()]
        if spec.kind != "column" and keys:
            first, after = spec.start(min(keys)), spec.start(max(keys) + 1)
            base["time_range"] = f"{first.isoformat()}..{(after - timedelta(microseconds=1)).isoformat()}"
    if not (base.get("source") and base.get("text_col")):
        what = "a service's store records no source" if stored_config.get("serve") else \
            "the store has no replay configuration"
        raise _UserError(what, "--over documents",
                         "give --source (a service's landing folder)" + ("" if base.get("text_col") else
                                                                          ", --text-col and --time-col"))
    base.setdefault("time_col", None)
    config = ReplayConfig(**base)
    vec = store.vectorizer()
    if vec is None:
        raise StoreError(f"{args.store}: no stored vocabulary; cannot vectorise documents")
    reader, src = open_epochs(config)
    with reader:
        # a source given anew (--source, a copy say) is the user's word; the stored one must not have changed
        changed = source_changes(None if args.source else stored_config.get("source_files"), src.fingerprint())
        if changed:
            raise _UserError(f"the source changed since the store was written ({counted(len(changed), 'file')} added, "
                             f"removed or rewritten, e.g. {changed[0]!r})", "--over documents",
                             "the documents read back would not be the ones fitted: use the source as it was "
                             "replayed, or --over nodes")
        epochs = list(reader.epochs())
    # by epoch key: a service numbers its epochs from the first it published, a replay from the
    # first of its source, so only the key (the time span) is the same
    match = [e for e in epochs if e.key == entry["key"]]
    if not match:
        raise _UserError(f"the source holds no row of epoch {entry['epoch']} ({entry['label']}) within its time "
                         f"range ({config.time_range})", "--source",
                         "use the source the store was written from (a service's: its landing folder)")
    rows = match[0].rows
    pos = {str(i): k for k, i in enumerate(rows.column("id").to_pylist())}
    missing = [d for d in stored.doc_ids if str(d) not in pos]
    if missing:
        raise _UserError(f"{len(missing)} stored documents of epoch {entry['epoch']} are not in the source "
                         f"(e.g. {missing[0]!r})", "--source", "use the source the store was replayed from")
    take = np.asarray([pos[str(d)] for d in stored.doc_ids], dtype=np.int64)
    X = vec.transform(rows.column("text").take(take))
    return X


def cmd_assign(args) -> int:
    """Assign SOURCE's documents to the nodes of one stored epoch's tree."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    from connectors.sources.files import open_source
    from connectors.stores.snapshot import StoreError
    from streamtree.replay import StoredTreeModel, load_model
    from streamtree.text import TextVectorizer

    _check_output(args.output, "assignments", args.store, inputs=(args.source,), force=args.force)
    store, entries = _read_store(args.store)
    entry = entries[-1] if args.epoch is None else resolve_epoch(entries, args.epoch)
    vec = store.vectorizer()
    if vec is None:
        raise StoreError(f"{args.store}: no stored vocabulary; cannot vectorise documents")
    model = load_model(args.store, int(entry["epoch"]))
    if isinstance(model, StoredTreeModel):
        print(f"note: epoch {entry['epoch']} ({entry['label']}) kept its tree but not its full model (the store "
              f"keeps the latest epoch's; --keep-checkpoints all keeps every one): documents are scored against "
              f"the stored tree, whose node parameters are within error {model.theta_error_:.3g} of the full "
              "ones (see SnapshotStore.read)", file=sys.stderr)
    stored = dict(store.config().get("replay") or {})
    text_col = args.text_col or stored.get("text_col")
    # times play no part in an assignment: read (and each row's checked) only when asked for
    time_col = args.time_col or None
    id_col = args.id_col or stored.get("id_col")
    if text_col is None:
        raise _UserError("no text column", "assign", "give --text-col")
    src = open_source(args.source, text_col, time_col, id_col, time_unit=args.time_unit, format=args.format,
                      time_format=args.time_format, delimiter=args.delimiter, untimed=True)
    rows = src.read_all()
    ids = rows.column("id").to_pylist()
    X = vec.transform(rows.column("text"))
    empty = TextVectorizer.empty_rows(X)
    keep = np.flatnonzero(~empty)
    n = len(ids)
    node = np.zeros(n, dtype=np.int64)
    probability = np.full(n, np.nan)
    log_density = np.full(n, np.nan)
    if keep.size:
        Xk = X[keep]
        P = model.transform(Xk)
        best = np.argmax(P, axis=1)
        node[keep] = model.trees_[-1].node_ids[best]
        probability[keep] = P[np.arange(keep.size), best]
        log_density[keep] = model.score_samples(Xk)
    reason = [None if ok else "empty after vocabulary filtering" for ok in ~empty]
    rejects = src.rejects.table() if src.rejects.total else None
    out_ids = ids + ([] if rejects is None else rejects.column("id").to_pylist())
    out_reason = reason + ([] if rejects is None else rejects.column("reason").to_pylist())
    n_rej = 0 if rejects is None else rejects.num_rows
    assigned = np.concatenate([~empty, np.zeros(n_rej, dtype=bool)])
    pad = np.zeros(n_rej)
    # rows in the source's order (files as read, rows by position), rejects in their places
    sources = rows.column("source").to_pylist() + ([] if rejects is None else rejects.column("source").to_pylist())
    rank = {name: k for k, name in enumerate(dict.fromkeys(sources))}
    positions = rows.column("position").to_numpy(zero_copy_only=False)
    if rejects is not None:
        positions = np.concatenate([positions, rejects.column("position").to_numpy(zero_copy_only=False)])
    order = np.lexsort((positions, np.array([rank[name] for name in sources], dtype=np.int64)))
    table = pa.table({
        "id": pa.array(out_ids, pa.string()),
        "node": pa.array(np.concatenate([node, pad.astype(np.int64)]), pa.int64(), mask=~assigned),
        "probability": pa.array(np.concatenate([probability, pad]), pa.float64(), mask=~assigned),
        "log_density": pa.array(np.concatenate([log_density, pad]), pa.float64(), mask=~assigned),
        "reason": pa.array(out_reason, pa.string()),
    }).take(order)
    table = table.replace_schema_metadata({_OUTPUT_MARK["assignments"]: json.dumps(
        {"store": args.store, "epoch": int(entry["epoch"]), "label": entry["label"]}).encode()})
    # under a temporary name, renamed into place: an earlier file is replaced only by a whole one
    tmp = os.path.join(os.path.dirname(os.path.abspath(args.output)),
                       f".{os.path.basename(args.output)}.tmp-{uuid.uuid4().hex}")
    try:
        pq.write_table(table, tmp)
        os.replace(tmp, args.output)
    finally:
        if os.path.exists(tmp):
            os.unlink(tmp)
    n_nodes = len(np.unique(node[keep])) if keep.size else 0
    counts = ", ".join(f"{r}: {c}" for r, c in src.rejects.counts.most_common())
    mean = f", mean log density {log_density[keep].mean():.4g}" if keep.size else ""
    print(f"assigned {keep.size} of {counted(n + n_rej, 'document')} to {counted(n_nodes, 'node')} of epoch "
          f"{entry['epoch']} "
          f"({entry['label']}){mean}; empty after vocabulary filtering: {int(empty.sum())}"
          + (f"; records not read as documents: {n_rej} ({counts})" if n_rej else ""))
    print(f"written: {args.output}")
    return 0


def cmd_evaluate(args) -> int:
    from streamtree.evaluate import EvaluationConfig, format_results, load_and_evaluate

    for name in ("test_fraction", "selection_fraction"):
        if hasattr(args, name) and not 0 < getattr(args, name) < 1:
            flag = "--" + name.replace("_", "-")
            raise _UserError(f"{flag} must be in (0, 1), got {getattr(args, name)}", "evaluate", "use e.g. 0.1")
    chosen = getattr(args, "protocol", EvaluationConfig().protocol)
    for name, protocol in (("restarts", "paper"), ("selection_fraction", "documents"), ("tie_se", "documents")):
        if hasattr(args, name) and chosen != protocol:  # it would be silently ignored
            flag = "--" + name.replace("_", "-")
            raise _UserError(f"{flag} applies to the {protocol} protocol only", "evaluate",
                             f"drop it, or add --protocol {protocol}")
    model = _model_options(args)
    config = _replay_config(args, model=dict(model))
    if config.time_col is None and config.epoch_col is None:
        raise _UserError("give --time-col (or --epoch-col with --epoch column)", "evaluate", "add the column name")
    protocol = {k: getattr(args, k) for k in ("protocol", "variants", "depths", "kappa0_grid", "restarts", "repeats",
                                              "seed", "test_fraction", "selection_fraction", "tie_se", "workers")
                if hasattr(args, k)}
    ev = EvaluationConfig(**protocol, max_docs_per_epoch=args.max_docs_per_epoch, max_epochs=args.max_epochs,
                          model=model)
    log = None if args.quiet else (lambda msg: print(msg, file=sys.stderr, flush=True))

    def hint(n_epochs: int, time_span_us: tuple[int, int] | None, resolution: str | None) -> None:
        # said once the source is bucketed, not after the runs: one epoch may not be worth them
        said = few_epochs_hint(n_epochs, time_span_us, config.epoch, resolution, default=args.epoch is None,
                               made_by="the evaluation")
        if said:
            print(f"hint: {said}", flush=True)

    results, splits = load_and_evaluate(config, ev, log=log, on_epochs=hint)
    print(format_results(results, splits, ev))
    return 0


class _UserError(Exception):
    def __init__(self, what: str, where: str, todo: str) -> None:
        super().__init__(f"{what} ({where}): {todo}")


def _ray_failure(exc: BaseException) -> str | None:
    """The one-line message of a failure of the Ray engine, or None if ``exc`` is not one.

    Checked before anything else: a worker's ValueError or OSError comes back as an exception
    that is also a ValueError or OSError, which would be taken for the user's mistake. Ray is
    not imported here (``--version`` stays fast): if it never was, no Ray error was raised.
    """
    ray_exceptions = sys.modules.get("ray.exceptions")
    if ray_exceptions is None or not isinstance(exc, ray_exceptions.RayError):
        return None
    cause = getattr(exc, "cause", None) if isinstance(exc, ray_exceptions.RayTaskError) else None
    if isinstance(cause, BaseException):
        return (f"the Ray engine failed: a worker raised {type(cause).__name__}: {cause}; "
                "run again with -vv for the worker's traceback, and report it")
    return (f"the Ray engine failed: {type(exc).__name__}: {exc}; check that the cluster's nodes are up and "
            "have memory to spare, then run again")


def _user_message(exc: BaseException) -> tuple[str, int] | None:
    """The one-line message and exit status of a user error or an engine failure, or None for
    a bug (which keeps its traceback)."""
    from connectors.sources import SourceError
    from connectors.stores import CorruptStoreError, StoreAccessError, StoreBusyError, StoreError

    from streamtree.engines.base import EngineFailure

    ray_failure = _ray_failure(exc)
    if ray_failure is not None:
        return ray_failure, EXIT_BUG
    if isinstance(exc, EngineFailure):  # its message says what to do: no traceback
        return f"the engine failed: {exc}", EXIT_BUG
    if isinstance(exc, SourceError):
        return f"cannot read source {exc}; check the path, the format and the column names", EXIT_USAGE
    if isinstance(exc, StoreBusyError):
        return f"snapshot store {exc}", EXIT_BUSY
    if isinstance(exc, (CorruptStoreError, StoreAccessError)):
        return f"snapshot store {exc}", EXIT_STORE
    if isinstance(exc, StoreError):
        return f"snapshot store {exc}", EXIT_USAGE
    if isinstance(exc, _UserError):
        return str(exc), EXIT_USAGE
    if isinstance(exc, FileNotFoundError):
        return f"{exc}; check the path", EXIT_USAGE
    if isinstance(exc, OSError) and exc.errno is not None:
        from connectors.stores.lease import os_reason

        where = f"{exc.filename}: " if exc.filename else ""
        return f"{where}{os_reason(exc)}", EXIT_STORE
    if isinstance(exc, ValueError):
        return f"{exc}; check the arguments", EXIT_USAGE
    return None


def _show_warning(message, category, filename, lineno, file=None, line=None) -> None:
    """A warning as the command line's other messages read (``warning: ...`` on stderr), not as
    Python's source location and line."""
    (file or sys.stderr).write(f"warning: {message}\n")


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = build_parser() if _names_command(argv) else _summary_parser()  # --version stays fast
    args = parser.parse_args(argv)
    level = logging.WARNING if args.verbose == 0 else logging.INFO if args.verbose == 1 else logging.DEBUG
    logging.basicConfig(level=level, format="%(levelname)s %(name)s: %(message)s")
    command = {"replay": cmd_replay, "show": cmd_show, "snapshot": cmd_snapshot,
               "evaluate": cmd_evaluate, "report": cmd_report, "serve": cmd_serve,
               "assign": cmd_assign}[args.command]
    global _last_signal
    _last_signal = None  # a signal of an earlier call in this process says nothing about this one
    previous = {}
    if threading.current_thread() is threading.main_thread():
        previous = {sig: signal.signal(sig, _on_interrupt) for sig in (signal.SIGTERM, signal.SIGINT)}
    shown_before = warnings.showwarning
    warnings.showwarning = _show_warning
    try:
        code = command(args)
        sys.stdout.flush()
        return code
    except BrokenPipeError:  # `streamtree show STORE | head`: the reader has what it wanted
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())  # so that the exit-time flush does not fail again
        return 0
    except BaseException as exc:
        interrupt = _interrupt_of(exc)
        if interrupt is not None:
            sys.stderr.write(f"\nstreamtree: {'terminated' if isinstance(interrupt, Terminated) else 'interrupted'}\n")
            return EXIT_TERMINATED if isinstance(interrupt, Terminated) else EXIT_INTERRUPTED
        if not isinstance(exc, Exception):
            raise
        # user errors become one line; anything else is a bug and raises
        found = _user_message(exc)
        if found is None or args.verbose >= 2:  # -vv: the full traceback, for bug reports
            raise
        msg, code = found
        sys.stderr.write(f"streamtree {args.command}: error: {' '.join(msg.split())}\n")
        return code
    finally:
        warnings.showwarning = shown_before
        for sig, handler in previous.items():
            if handler is not None:  # None: set outside Python, which cannot be restored from here
                signal.signal(sig, handler)


if __name__ == "__main__":
    sys.exit(main())
