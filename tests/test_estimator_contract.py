"""The scikit-learn contract of DTSSBP and TextVectorizer, and the core's import rules."""

import ast
from pathlib import Path

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.base import clone
from sklearn.decomposition import TruncatedSVD
from sklearn.exceptions import NotFittedError
from sklearn.pipeline import Pipeline

from streamtree import DTSSBP
from streamtree.synthetic import vmf_tree_corpus
from streamtree.text import TextVectorizer

PKG = Path(__file__).resolve().parent.parent / "streamtree"


def small_epoch(seed=0):
    return vmf_tree_corpus(np.random.default_rng(seed), p=60, branching=(2,), kappa=20.0, beta=200.0,
                           docs_per_node=15).X


@pytest.mark.parametrize("bad", [dict(n_map_iter=-5), dict(split_proposals=-1), dict(n_jobs=0),
                                 dict(merge_moves="no"), dict(likelihood="poisson"), dict(window=-1),
                                 dict(lam=1.5), dict(kappa0=0.0), dict(n_shards=0), dict(engine="nope"),
                                 dict(concentration_bounds=(5.0, 1.0)), dict(random_state=-3),
                                 dict(min_node_docs=0), dict(eta=1.0), dict(noise_var=-1.0),
                                 dict(max_depth=0)])
def test_every_bad_parameter_is_rejected_at_fit(bad):
    model = DTSSBP(n_sweeps=1, **bad)  # construction never validates (scikit-learn convention)
    with pytest.raises(ValueError, match=f"'{next(iter(bad))}' parameter"):
        model.partial_fit(small_epoch())


def test_a_wrong_vocabulary_is_named_before_the_rows_are_checked():
    # rows of a different width that are also empty: the column count is the error, not the rows
    counts = sp.csr_matrix(np.random.default_rng(0).poisson(1.0, size=(40, 30)).astype(float))
    model = DTSSBP(n_sweeps=1, random_state=0).partial_fit(counts)
    narrow = sp.csr_matrix((5, 10))
    for method in (model.predict, model.score_samples, model.partial_fit):
        with pytest.raises(ValueError, match="X has 10 features, but the model was fitted with 30"):
            method(narrow)


def test_clone_params_and_not_fitted():
    model = DTSSBP(kappa0=10.0, n_jobs=-1, concentration_bounds=(1.0, 1e5), random_state=3)
    twin = clone(model)
    assert twin.get_params() == model.get_params() and twin is not model
    assert "kappa0=10.0" in repr(model)
    with pytest.raises(NotFittedError):
        model.score_samples(small_epoch())
    with pytest.raises(NotFittedError):
        model.get_checkpoint()


def test_partial_fit_returns_self_and_fit_needs_a_sequence():
    X = small_epoch()
    model = DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0)
    assert model.partial_fit(X) is model and model.trees_[-1].epoch == 0
    assert model.partial_fit(small_epoch(1)) is model and [t.epoch for t in model.trees_] == [0, 1]
    with pytest.raises(TypeError, match="partial_fit"):
        DTSSBP(likelihood="vmf", n_sweeps=2).fit(X)
    with pytest.raises(TypeError, match="partial_fit"):
        DTSSBP(n_sweeps=2, likelihood="gaussian").fit(np.zeros((4, 3)))
    refit = clone(model).fit([X, small_epoch(1)])
    assert [t.epoch for t in refit.trees_] == [0, 1]
    # refitting starts from scratch
    assert [t.epoch for t in refit.fit([X]).trees_] == [0]


class _Stop(Exception):
    pass


@pytest.mark.parametrize("likelihood", ["vmf", "multinomial"])
def test_an_epoch_that_fails_part_way_leaves_the_model_as_it_was(likelihood):
    """The sampler changes the chain's state in place. An epoch stopped part-way (here by its
    progress callback; an engine error or an interrupt alike) left the node parameters changed
    and the seeds advanced while ``trees_`` still ended at the previous epoch, so the model
    scored with parameters of no epoch, a checkpoint saved them, and a retry differed from the
    uninterrupted chain."""
    def epochs(seed):
        X = small_epoch(seed)
        return X if likelihood == "vmf" else sp.csr_matrix(np.round(X.multiply(X > 0) * 20))

    def stop_at_sweep_3(done, n, k):
        if done == 3:
            raise _Stop

    X0, X1, X2 = epochs(0), epochs(1), epochs(2)
    model = DTSSBP(likelihood=likelihood, n_sweeps=6, random_state=0).partial_fit(X0)
    arrays, meta = model.get_checkpoint()
    scores = model.score_samples(X1)
    with pytest.raises(_Stop):
        model.partial_fit(X1, callback=stop_at_sweep_3)
    after, meta_after = model.get_checkpoint()
    assert sorted(after) == sorted(arrays) and meta_after == meta
    for name in arrays:
        np.testing.assert_array_equal(after[name], arrays[name], err_msg=name)
    np.testing.assert_array_equal(model.score_samples(X1), scores)
    uninterrupted = DTSSBP(likelihood=likelihood, n_sweeps=6, random_state=0).partial_fit(X0).partial_fit(X1)
    model.partial_fit(X1).partial_fit(X2)
    uninterrupted.partial_fit(X2)
    for got, want in zip(model.trees_, uninterrupted.trees_, strict=True):
        np.testing.assert_array_equal(got.assignments, want.assignments)
        np.testing.assert_array_equal(got.theta, want.theta)
    # the first epoch stopped part-way leaves an unfitted model, and a retry is the uninterrupted chain
    fresh = DTSSBP(likelihood=likelihood, n_sweeps=6, random_state=0)
    with pytest.raises(_Stop):
        fresh.partial_fit(X0, callback=stop_at_sweep_3)
    with pytest.raises(NotFittedError):
        fresh.score_samples(X0)
    np.testing.assert_array_equal(fresh.partial_fit(X0).trees_[0].theta, uninterrupted.trees_[0].theta)


def test_an_empty_first_epoch_is_refused_before_the_model_changes():
    model = DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0)
    empty = small_epoch()[:0]
    with pytest.raises(ValueError, match="first epoch must contain documents"):
        model.partial_fit(empty)
    with pytest.raises(NotFittedError):
        model.predict(small_epoch())
    np.testing.assert_array_equal(model.partial_fit(small_epoch()).trees_[0].assignments,
                                  DTSSBP(likelihood="vmf", n_sweeps=2, random_state=0)
                                  .partial_fit(small_epoch()).trees_[0].assignments)


def test_fitting_leaves_the_callers_matrix_as_it_was():
    """A CSR matrix with unsorted columns and a duplicate entry (the same matrix once summed
    and sorted) is fitted like its canonical form, and the caller's arrays keep the order
    they were given: the input check sums and sorts a copy."""
    rng = np.random.default_rng(0)
    dense = rng.poisson(0.6, size=(40, 12)).astype(float)
    dense[:, 0] += 1.0  # no empty rows
    canonical = sp.csr_matrix(dense)
    r, c = canonical.nonzero()
    v = canonical.data.copy()
    v[0] -= 1.0  # the first entry stored as two that sum to it
    r, c, v = np.append(r, r[0]), np.append(c, c[0]), np.append(v, 1.0)
    order = np.lexsort((rng.random(v.size), r))  # by row, columns shuffled within a row
    indptr = np.concatenate([[0], np.cumsum(np.bincount(r, minlength=dense.shape[0]))])
    messy = sp.csr_matrix((v[order], c[order], indptr), shape=dense.shape)
    assert not messy.has_canonical_format and np.array_equal(messy.toarray(), dense)
    kept = {name: getattr(messy, name).copy() for name in ("data", "indices", "indptr")}
    a = DTSSBP(n_sweeps=2, max_depth=2, random_state=0).fit([messy])
    for name, arr in kept.items():
        assert np.array_equal(getattr(messy, name), arr), name
    b = DTSSBP(n_sweeps=2, max_depth=2, random_state=0).fit([canonical])
    assert np.array_equal(a.trees_[-1].assignments, b.trees_[-1].assignments)
    assert np.array_equal(a.trees_[-1].theta, b.trees_[-1].theta)


def test_gaussian_unnormalised_score_drops_the_normaliser():
    rng = np.random.default_rng(0)
    X = np.vstack([rng.normal(0, 1, (30, 2)), rng.normal(8, 1, (30, 2))])
    model = DTSSBP(likelihood="gaussian", sigma0=25.0, noise_var=1.0, n_sweeps=5, random_state=0).fit([X])
    norm, unnorm = model.score_samples(X[:7]), model.score_samples(X[:7], normalized=False)
    # every term loses its factor (2 pi v)^(-p/2) with v >= noise_var = 1 (v = 1 for live nodes,
    # prior + noise variance for new-node terms), so the difference is at least p/2 log(2 pi)
    assert np.all(np.isfinite(unnorm))
    assert np.all(unnorm - norm >= np.log(2 * np.pi) - 1e-9)
    assert np.all(unnorm - norm <= np.log(2 * np.pi * (1 + 25.0)))


def test_text_vectorizer_is_a_pipeline_step():
    texts = ["war army navy", "tax revenue debt", "army navy soldiers", "debt tax bank", "zzz"]
    pipe = Pipeline([("vec", TextVectorizer(min_df=1, max_df=1.0, stop_words=None)), ("svd", TruncatedSVD(2))])
    Z = pipe.fit_transform(texts)
    assert Z.shape == (5, 2)
    vec = clone(pipe.named_steps["vec"]).fit(texts[:4])
    X = vec.transform(texts)
    assert sp.issparse(X) and X.shape[0] == 5
    assert vec.empty_rows(X).tolist() == [False, False, False, False, True]
    counts = clone(vec).set_params(norm=None).fit(texts[:4]).transform(["army army navy"])
    assert counts.toarray().max() == 2.0
    with pytest.raises(ValueError, match="'min_df' parameter"):
        TextVectorizer(min_df=-1).fit(texts)
    with pytest.raises(NotFittedError):
        TextVectorizer().transform(texts)


def _imports(path: Path) -> set[str]:
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names.update(a.name for a in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module:
            names.add(node.module)
    return names


CORE = [p for p in PKG.rglob("*.py") if p.parent.name in ("inference", "likelihoods")] + [
    PKG / n for n in ("model.py", "tree.py", "window.py", "variants.py", "epoch_tree.py", "text.py")]


@pytest.mark.parametrize("path", CORE, ids=lambda p: str(p.relative_to(PKG)))
def test_core_imports_no_engine_or_connector(path):
    bad = {m for m in _imports(path) if m.startswith(("streamtree.engines", "connectors", "ray"))}
    assert not bad, f"{path.name} imports {bad}"


@pytest.mark.parametrize("path", [PKG / "model.py"] + sorted((PKG / "inference").glob("*.py")),
                         ids=lambda p: p.name)
def test_sampler_never_branches_on_the_family(path):
    text = path.read_text()
    for name in ("vmf", "gaussian", "multinomial"):
        assert f'== "{name}"' not in text and f"== '{name}'" not in text, (path.name, name)
