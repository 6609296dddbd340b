"""The events a default fit reports on a stream whose events are known (issue 9, item 4).

Corpus (written here, not the model's generator): word counts over 2,000 terms, 20% of each
document's tokens from a Zipf background, the rest from its topic (documents of 30-120
tokens); topics are Dirichlet(0.8) weights over 150 words of their own, and each epoch draws
its documents over the topics alive, by share:

* A stays the same throughout;
* G1 and G2 share 80 of their words (a parent topic with two children) and stay;
* B dies at ``--death`` (epoch 4);
* C divides at ``--division`` (epoch 3) into C1 and C2: each keeps one half of C's words at
  C's weights and adds 40 words of its own (30% of its weight);
* D drifts: ``--drift`` of its words (15 of 150) are replaced by new ones every epoch;
* E is born at ``--birth`` (epoch 2), a topic of new words whose share grows.

Model: ``DTSSBP`` at its defaults apart from ``max_depth`` (3), raw counts, one
``partial_fit`` per epoch. Each node is labelled with the true topic most of the documents
of its subtree come from. Printed per seed and summed over the seeds:

* every ``split_from`` event by what it joins: a part of C from C (the division), a node
  from another node of the same topic, a node without documents of the epoch (left with past
  documents only), or two unrelated topics;
* how the division shows: each of C1 and C2's nodes keeps an id C had, is split from one,
  is born split from a node born in the same epoch, or is born with no split;
* E's birth: born with no split from an older node (right), or split from one; and in how
  many epochs E's top-level branch (below a child of the root) holds another true topic's
  node (unrelated topics under one parent);
* the epochs from B's last documents to its nodes' ``died`` events (the stick window keeps a
  node with past documents alive: with ``window=2``, the two epochs after its last documents
  are still its, and it dies in the third);
* births and splits in all.

Usage: python bench/bench_events.py [--seeds 0-5] [--epochs 8] [--documents 1200] [--drift 15]
"""

from __future__ import annotations

import argparse
import collections
import time

import numpy as np
import scipy.sparse as sp

from bench_planted import parse_integers, top_branches
from streamtree import DTSSBP

V = 2000
TOPIC_WORDS = 150
BACKGROUND = 300
BACKGROUND_SHARE = 0.2


class Stream:
    """The scripted stream: per epoch a count matrix and each document's true topic."""

    def __init__(self, rng: np.random.Generator, *, epochs: int, documents: int, drift: int, birth: int,
                 division: int, death: int) -> None:
        self.rng = rng
        order = rng.permutation(V)
        self.background = order[:BACKGROUND]
        self._pool = list(order[BACKGROUND:])
        bg = 1.0 / np.arange(1, BACKGROUND + 1)
        self.bg_p = bg / bg.sum()
        topics = {k: self._topic(self._take(TOPIC_WORDS)) for k in "ABCDE"}
        shared = self._take(80)
        for k in ("G1", "G2"):
            topics[k] = self._topic(np.concatenate([shared, self._take(80)]))
        c = topics["C"]
        for k, half in (("C1", slice(0, 75)), ("C2", slice(75, 150))):
            own = self._take(40)
            w = np.concatenate([c["p"][half], 0.3 / 0.7 * c["p"][half].sum() * rng.dirichlet(np.full(40, 0.8))])
            topics[k] = {"w": np.concatenate([c["w"][half], own]), "p": w / w.sum()}
        self.topics = topics
        self.counts, self.labels = [], []
        for t in range(epochs):
            if t and drift:
                d = topics["D"]
                i = rng.choice(TOPIC_WORDS, drift, replace=False)
                d["w"] = d["w"].copy()
                d["w"][i] = self._take(drift)
            share = {"A": 1.0, "G1": 0.7, "G2": 0.7, "D": 1.0}
            if t < death:
                share["B"] = 1.0
            share.update({"C": 1.2} if t < division else {"C1": 0.6, "C2": 0.6})
            if t >= birth:
                share["E"] = 0.4 + 0.2 * (t - birth)
            names = list(share)
            p = np.array([share[k] for k in names])
            labels = np.array(names)[rng.choice(len(names), documents, p=p / p.sum())]
            self.counts.append(self._documents(labels))
            self.labels.append(labels)

    def _take(self, n: int) -> np.ndarray:
        out, self._pool = np.array(self._pool[:n]), self._pool[n:]
        return out

    def _topic(self, words: np.ndarray) -> dict:
        return {"w": words, "p": self.rng.dirichlet(np.full(words.size, 0.8))}

    def _documents(self, labels: np.ndarray) -> sp.csr_matrix:
        rng = self.rng
        X = np.zeros((labels.size, V))
        for j, k in enumerate(labels):
            t = self.topics[k]
            n = int(rng.integers(30, 121))
            nb = rng.binomial(n, BACKGROUND_SHARE)
            np.add.at(X[j], t["w"][rng.choice(t["w"].size, n - nb, p=t["p"])], 1.0)
            np.add.at(X[j], self.background[rng.choice(BACKGROUND, nb, p=self.bg_p)], 1.0)
        return sp.csr_matrix(X)


def topic_of(tree, labels: np.ndarray) -> dict[int, str]:
    """Each node's true topic: the most common among the documents of its subtree."""
    index = {int(n): k for k, n in enumerate(tree.node_ids)}
    seen: dict[int, collections.Counter] = collections.defaultdict(collections.Counter)
    for z, lab in zip(np.asarray(tree.assignments).tolist(), labels.tolist()):
        while z != -1:
            seen[z][lab] += 1
            z = int(tree.parent[index[z]])
    return {n: c.most_common(1)[0][0] for n, c in seen.items()}


def measure(stream: Stream, model: DTSSBP, args) -> collections.Counter:
    out: collections.Counter = collections.Counter()
    trees = model.trees_
    topics = [topic_of(tree, labels) for tree, labels in zip(trees, stream.labels)]
    for t in range(1, len(trees)):
        tree, ev = trees[t], trees[t].events
        splits = {int(n): int(o) for n, k, o in zip(ev.node_id, ev.event, ev.other_id) if k == "split_from"}
        born = set(ev.of("born").node_id.tolist())
        out["born"] += len(born)
        out["split_from events"] += len(splits)
        for n, o in splits.items():
            now, before = topics[t].get(n), topics[t - 1].get(o)
            out["split: " + ("left with past documents only" if now is None else
                             "from a node without documents" if before is None else
                             "same topic" if now == before else
                             "a part of C from C" if before == "C" and now in ("C1", "C2") else
                             "unrelated topics")] += 1
        counts = dict(zip(tree.node_ids.tolist(), tree.counts.tolist()))
        if t == args.division:
            had_c = {n for n, k in topics[t - 1].items() if k == "C"}
            for part in ("C1", "C2"):
                z = np.asarray(tree.assignments)[stream.labels[t] == part]
                node = int(collections.Counter(z.tolist()).most_common(1)[0][0])
                out["division: " + ("part keeps an id C had" if node in had_c else
                                    "part split from a node of C" if splits.get(node) in had_c else
                                    "part split from a node born now" if node in splits else
                                    "part born, no split")] += 1
        if t == args.birth:
            z = np.asarray(tree.assignments)[stream.labels[t] == "E"]
            node = int(collections.Counter(z.tolist()).most_common(1)[0][0])
            older = set(trees[t - 1].node_ids.tolist())
            out["birth: E " + ("split from an older node" if splits.get(node) in older else
                               "born" if node in born else "under an old id")] += 1
        if t >= args.birth:  # the topics E shares its top-level branch with
            z = np.asarray(tree.assignments)
            branch = top_branches(dict(zip(tree.node_ids.tolist(), tree.parent.tolist())))
            mine = branch[int(collections.Counter(z[stream.labels[t] == "E"].tolist()).most_common(1)[0][0])]
            others = {k for k in np.unique(stream.labels[t]) if k != "E" and
                      branch[int(collections.Counter(z[stream.labels[t] == k].tolist()).most_common(1)[0][0])] == mine}
            out["E's branch holds another topic (epochs)" if others else "E's branch is its own (epochs)"] += 1
        if t == args.death:
            b_nodes = {n for n, k in topics[t - 1].items() if k == "B" and counts.get(n, 0) == 0}
            for later in range(t, len(trees)):
                gone = b_nodes & set(trees[later].died.tolist())
                if gone:
                    out[f"death: B's nodes die {later - t + 1} epochs after its last documents"] += len(gone)
                b_nodes -= gone
    return out


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--seeds", default="0-5")
    p.add_argument("--epochs", type=int, default=8)
    p.add_argument("--documents", type=int, default=1200, help="documents per epoch")
    p.add_argument("--drift", type=int, default=15, help="D's words replaced per epoch (of 150)")
    p.add_argument("--birth", type=int, default=2)
    p.add_argument("--division", type=int, default=3)
    p.add_argument("--death", type=int, default=4)
    p.add_argument("--max-depth", type=int, default=3)
    args = p.parse_args()
    total: collections.Counter = collections.Counter()
    for seed in parse_integers(args.seeds):
        stream = Stream(np.random.default_rng(seed), epochs=args.epochs, documents=args.documents, drift=args.drift,
                        birth=args.birth, division=args.division, death=args.death)
        cpu = time.process_time()
        model = DTSSBP(max_depth=args.max_depth, random_state=seed)
        for t, X in enumerate(stream.counts):
            model.partial_fit(X, epoch=t)
        cpu = time.process_time() - cpu
        found = measure(stream, model, args)
        total += found
        print(f"seed {seed} ({cpu:.1f} s CPU):")
        for k in sorted(found):
            print(f"    {k}: {found[k]}")
    print(f"over seeds {args.seeds}:")
    for k in sorted(total):
        print(f"    {k}: {total[k]}")


if __name__ == "__main__":
    main()
