"""Recovery of the paper's Figure 2 evolving tree (Gaussian) over seeds, and the ceiling the model sets.

Set-up: ``tests/test_model.py::test_gaussian_evolving_tree_figure2`` (data of
:func:`streamtree.synthetic.gaussian_evolving_tree` at ``default_rng(7)``; ``window=1``,
``max_depth=3``, ``sigma0=25``, ``sigma1=0.5``, ``eta=0.5``, known noise ``0.25``, 40 sweeps).

Two figures:

1. **Seeds.** The share of seeds (``random_state``) at which every check of that test holds,
   with alpha0, lam and gamma slice-sampled (the default, as in the test) and, as the baseline
   in the same run, held at their starting values (``sample_hyperparameters=False``). Each
   failing seed is classified by what is wrong with the first epoch's tree (several may apply):
   ``root-below`` (the root's documents do not sit at the tree's root: the root is empty or
   holds another cluster, a duplicate of the root's cluster sits below it), ``A1-beside-A``
   (A1's node is not a child of A's), ``split`` (a true cluster's documents are spread over two
   nodes, the smaller part holding at least 5), ``A1-alive`` (A1's node still holds documents
   in the last epoch) and ``ari`` (ARI below 0.9 in some epoch).
2. **The target's share.** The model's posterior over the tree structures of the first epoch
   given the true partition of its documents: node means integrated out in closed form (root
   flat, parent links ``N(theta_parent, sigma0 sigma1^d)``, as the sampler's target), sticks
   integrated out (the collapsed TSSB prior of :mod:`streamtree.inference.merge`), summed over
   every order of siblings, alpha0, lam and gamma either integrated under the sampler's priors
   (:data:`streamtree.inference.hyper.HYPER_PRIORS`, grid quadrature) or held at the
   estimator's values. Structures: every tree on the four clusters (``root``, ``A``, ``B``,
   ``A1``) of depth at most 3, and every such forest under an empty root. The probability of
   the true structure is what a sampler that mixed over structures would give the test's
   structural checks of the first epoch; ``A at root`` is the true tree's mirror image (A's
   documents at the root, the root's in a child of it, B below that), which the data's symmetry
   makes about as probable.

Usage: python bench/bench_figure2.py [--seeds 0-39] [--sigma0 25] [--grid 41] [--no-seeds]
"""

from __future__ import annotations

import argparse
import itertools
import time

import numpy as np
from scipy.special import betaln, logsumexp
from sklearn.metrics import adjusted_rand_score

import streamtree  # noqa: F401  (configures numba's cache before any model import)
from streamtree.inference.hyper import HYPER_PRIORS
from streamtree.inference.merge import collapsed_log_prior
from streamtree.model import DTSSBP
from streamtree.synthetic import gaussian_evolving_tree
from streamtree.tree import TreeArrays

from bench_planted import parse_integers

SETUP = dict(likelihood="gaussian", window=1, max_depth=3, sigma0=25.0, sigma1=0.5, eta=0.5, noise_var=0.25,
             n_sweeps=40)
CLUSTERS = ("root", "A", "B", "A1")
TRUE_PARENT = (-1, 0, 0, 1)  # A and B under the root, A1 under A
MIRROR_PARENT = (1, -1, 0, 1)  # A at the root: the root's cluster and A1 under A, B under the root's cluster


# ---------------------------------------------------------------------- 1. seeds
def majority_ids(truth: np.ndarray, assigned: np.ndarray) -> dict[str, int]:
    out = {}
    for name in np.unique(truth):
        ids, cnt = np.unique(assigned[truth == name], return_counts=True)
        out[str(name)] = int(ids[np.argmax(cnt)])
    return out


def failed_checks(epochs, trees) -> list[str]:
    """The checks of the test that fail (the test's assertions, in its order)."""
    fails, majors = [], []
    for e, tree in zip(epochs, trees):
        if adjusted_rand_score(e.labels, tree.assignments) < 0.9:
            fails.append(f"ari{tree.epoch}")
        majors.append(majority_ids(e.labels, tree.assignments))
    for name in ("root", "A", "B"):
        if not majors[0][name] == majors[1][name] == majors[2][name]:
            fails.append(f"id-{name}")
    if majors[0]["A1"] != majors[1]["A1"]:
        fails.append("id-A1")
    c = majors[1]["C"]
    if trees[1].born[trees[1].index_of(c)] != 1 or majors[2]["C"] != c:
        fails.append("C")
    if majors[0]["A1"] in set(trees[2].assignments.tolist()):
        fails.append("A1-alive")
    t0 = trees[0]
    if t0.parent[t0.index_of(majors[0]["A1"])] != majors[0]["A"]:
        fails.append("parent-A1")
    for name in ("A", "B"):
        if t0.parent[t0.index_of(majors[0][name])] != majors[0]["root"]:
            fails.append(f"parent-{name}")
    return fails


def failure_modes(epochs, trees, fails: list[str]) -> list[str]:
    """What is wrong with the first epoch's tree (see the module docstring)."""
    e, t0 = epochs[0], trees[0]
    major = majority_ids(e.labels, t0.assignments)
    modes = []
    if major["root"] != int(t0.node_ids[0]):
        modes.append("root-below")
    if major["A1"] != major["A"] and t0.parent[t0.index_of(major["A1"])] != major["A"]:
        modes.append("A1-beside-A")
    for name in CLUSTERS:
        _, cnt = np.unique(t0.assignments[e.labels == name], return_counts=True)
        if cnt.size > 1 and np.sort(cnt)[-2] >= 5:
            modes.append("split")
            break
    if "A1-alive" in fails:
        modes.append("A1-alive")
    if any(f.startswith("ari") for f in fails):
        modes.append("ari")
    return modes or ["other"]


def run_seeds(seeds, **overrides) -> tuple[int, dict[str, int], float]:
    epochs = gaussian_evolving_tree(np.random.default_rng(7))
    passed, modes = 0, {}
    t0 = time.process_time()
    for seed in seeds:
        m = DTSSBP(**{**SETUP, **overrides, "random_state": seed})
        trees = [m.partial_fit(e.X).trees_[-1] for e in epochs]
        fails = failed_checks(epochs, trees)
        if not fails:
            passed += 1
            continue
        for mode in failure_modes(epochs, trees, fails):
            modes[mode] = modes.get(mode, 0) + 1
    return passed, modes, time.process_time() - t0


# ---------------------------------------------------------------------- 2. the target's share
def depths(parent) -> np.ndarray:
    out = np.zeros(len(parent), dtype=np.int64)
    for k in range(len(parent)):
        j = k
        while parent[j] >= 0:
            j = parent[j]
            out[k] += 1
    return out


def gaussian_log_marginal(parent, n, S, SS, sigma0: float, sigma1: float, noise: float) -> float:
    """log of the integral over every node mean of prod links x prod documents (root flat)."""
    K, p = S.shape
    d = depths(parent)
    J = np.diag(n / noise)
    out = -0.5 * n.sum() * p * np.log(2 * np.pi * noise) - SS.sum() / (2 * noise)
    for c in range(K):
        if parent[c] < 0:
            continue
        v = sigma0 * sigma1 ** d[c]
        b = parent[c]
        J[c, c] += 1 / v
        J[b, b] += 1 / v
        J[c, b] -= 1 / v
        J[b, c] -= 1 / v
        out -= 0.5 * p * np.log(2 * np.pi * v)
    h = S / noise
    _, logdet = np.linalg.slogdet(J)
    return float(out + 0.5 * p * (K * np.log(2 * np.pi) - logdet) + 0.5 * np.sum(h * np.linalg.solve(J, h)))


def stick_log_prior(parent, rank, n, alpha0, lam, gamma, max_depth: int):
    """The collapsed TSSB prior (no past epochs), broadcast over arrays of alpha0, lam, gamma."""
    K = len(parent)
    d = depths(parent)
    S = np.array(n, dtype=np.float64)
    for k in np.argsort(-d):
        if parent[k] >= 0:
            S[parent[k]] += S[k]
    out = 0.0
    for k in range(K):
        if d[k] < max_depth:
            a = alpha0 * lam ** float(d[k])
            out = out + betaln(1 + n[k], a + S[k] - n[k]) - betaln(1.0, a)
        if parent[k] >= 0:
            later = sum(S[j] for j in range(K) if parent[j] == parent[k] and rank[j] > rank[k])
            out = out + betaln(1 + S[k], gamma + later) - betaln(1.0, gamma)
    return out


def sibling_orders(parent):
    groups: dict[int, list[int]] = {}
    for k, p in enumerate(parent):
        if p >= 0:
            groups.setdefault(p, []).append(k)
    for combo in itertools.product(*[list(itertools.permutations(g)) for g in groups.values()]):
        rank = [0] * len(parent)
        for perm in combo:
            for r, k in enumerate(perm):
                rank[k] = r
        yield rank


def structures(max_depth: int):
    """Parent tuples over the four clusters (one is the root), then over the four under an
    empty fifth node (the root), depth at most ``max_depth``."""
    for k, rng in ((4, range(-1, 4)), (5, range(0, 5))):
        for head in itertools.product(rng, repeat=4):
            parent = tuple(head) + ((-1,) if k == 5 else ())
            if any(parent[i] == i for i in range(4)) or sum(p < 0 for p in parent) != 1:
                continue
            d = np.zeros(k, dtype=np.int64)
            ok = True
            for i in range(k):
                j, steps = i, 0
                while parent[j] >= 0 and steps <= k:
                    j, steps = parent[j], steps + 1
                if steps > k or steps > max_depth:
                    ok = False
                    break
            if ok:
                yield parent


def hyper_grid(size: int):
    axes = []
    for name in ("alpha0", "lam", "gamma"):
        low, high, log_scale = HYPER_PRIORS[name]
        axes.append(np.exp(np.linspace(np.log(low), np.log(high), size)) if log_scale
                    else np.linspace(low, high, size))
    return np.meshgrid(*axes, indexing="ij")


def structure_posterior(sigma0: float, grid: int) -> dict[str, dict[str, float]]:
    """P(structure | true partition of epoch 0) with the hyperparameters integrated or fixed."""
    e = gaussian_evolving_tree(np.random.default_rng(7))[0]
    lab = np.array([CLUSTERS.index(x) for x in e.labels])
    n = np.array([np.sum(lab == k) for k in range(4)], dtype=np.float64)
    S = np.array([e.X[lab == k].sum(0) for k in range(4)])
    SS = np.array([np.sum(e.X[lab == k] ** 2) for k in range(4)])
    A, L, G = hyper_grid(grid)
    start = DTSSBP()
    fixed = dict(alpha0=start.alpha0, lam=start.lam, gamma=start.gamma)
    md = SETUP["max_depth"]
    # the vectorised prior against the sampler's own at the true tree (pre-order: root, A, A1, B)
    arrays = TreeArrays(np.arange(4), np.array([-1, 0, 1, 0]), np.array([0, 1, 2, 1]), np.array([0, 0, 0, 1]))
    ours = stick_log_prior((-1, 0, 0, 1), (0, 0, 1, 0), n, 1.3, 0.4, 0.7, md)
    theirs = collapsed_log_prior(arrays, np.zeros(4), n[[0, 1, 3, 2]], alpha0=1.3, lam=0.4, gamma=0.7,
                                 max_depth=md, root_holds_data=True)
    assert abs(ours - theirs) < 1e-8, (ours, theirs)
    rows = []
    for parent in structures(md):
        k = len(parent)
        nn = np.append(n, 0.0)[:k]
        SSk = np.append(SS, 0.0)[:k]
        Sk = np.vstack([S, np.zeros((1, S.shape[1]))])[:k]
        lik = gaussian_log_marginal(parent, nn, Sk, SSk, sigma0, SETUP["sigma1"], SETUP["noise_var"])
        integ, held = [], []
        for rank in sibling_orders(parent):
            integ.append(logsumexp(stick_log_prior(parent, rank, nn, A, L, G, md)) - np.log(A.size))
            held.append(float(stick_log_prior(parent, rank, nn, **fixed, max_depth=md)))
        rows.append((parent, lik + logsumexp(integ), lik + logsumexp(held)))
    out = {}
    for col, name in ((1, "integrated"), (2, "fixed")):
        tot = logsumexp([r[col] for r in rows])
        prob = {r[0]: float(np.exp(r[col] - tot)) for r in rows}
        chains = [p for p in prob if len(p) == 4 and max(depths(p)) == 3]  # four nodes in a line
        out[name] = {
            "true": prob[TRUE_PARENT],
            "A at root": prob[MIRROR_PARENT],
            "chains": sum(prob[p] for p in chains),
            "A1 beside A": prob[(-1, 0, 0, 0)],
            "empty root": sum(v for p, v in prob.items() if len(p) == 5),
        }
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-39", help="random_state values, e.g. 0-39 (default) or 0-3,8")
    p.add_argument("--sigma0", type=float, default=SETUP["sigma0"], help="parent-link variance at depth 0 (default 25, the test's)")
    p.add_argument("--grid", type=int, default=41, help="grid points per hyperparameter (default 41)")
    p.add_argument("--no-seeds", action="store_true", help="only the target's share")
    args = p.parse_args()
    t0 = time.process_time()
    post = structure_posterior(args.sigma0, args.grid)
    print(f"target: P(structure | true partition of epoch 0), sigma0={args.sigma0:g} "
          f"({time.process_time() - t0:.1f} s CPU)")
    keys = list(post["integrated"])
    print(f"  {'alpha0, lam, gamma':22s}" + "".join(f"{k:>14s}" for k in keys))
    for name, label in (("integrated", "sampled (integrated)"), ("fixed", "fixed at 1, 0.5, 0.5")):
        print(f"  {label:22s}" + "".join(f"{post[name][k]:14.3f}" for k in keys))
    if args.no_seeds:
        return
    seeds = parse_integers(args.seeds)
    print(f"seeds {args.seeds}: every check of the test holds at")
    for label, over in (("sampled (the test)", {}), ("fixed (baseline)", {"sample_hyperparameters": False})):
        passed, modes, cpu = run_seeds(seeds, sigma0=args.sigma0, **over)
        detail = ", ".join(f"{k} {v}" for k, v in sorted(modes.items(), key=lambda kv: -kv[1]))
        print(f"  alpha0, lam, gamma {label:20s} {passed:3d} of {len(seeds)}  ({cpu:.0f} s CPU); failures: {detail}")


if __name__ == "__main__":
    main()
