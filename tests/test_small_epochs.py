"""Small epochs at defaults: a planted hierarchical-Dirichlet stream (not the model's own
generator) of 60 documents per epoch.

Under the former scale-free hyperparameter priors the sampled alpha0 ran to the top of its
support (55-100) on such a stream, and from the third epoch on 2-3 nodes held all the
documents (mean adjusted Rand index 0.05-0.06 against the planted nodes on these seeds); on
SOU replayed by year the same mechanism, with the old retirement of carried leaves, left years
as the root alone. With Gamma priors and past documents that never move, the trees kept
4-14 occupied nodes and a mean ARI of 0.15-0.19; the priors were then reverted (with the
heat-bath lift of carried internal nodes they tripled births, deaths and parent changes on SOU
by decade), and 3 nodes held these epochs (median), with or without the exact carried lift.
Scoring each document at its own node without its own counts passes it again (median 4
occupied nodes, mean ARI 0.144 on these seeds; by a small margin: seeds 4 and 5 give 0.118
and 0.087).

Those bounds (median 4 occupied nodes, mean ARI 0.11) were read at seeds 2 and 3 alone, and
held there by the choice of seeds: at seeds 0-7 the same code gave a mean ARI of 0.098 and a
median of 3 occupied nodes (a mean of 3.50; per seed 0.057-0.150). When a split came to draw
its place's kind first (each empty kept node a kind of its own), seeds 2 and 3 fell to 0.100
while seeds 0-7 rose to 0.103 (3.59 nodes). The test now reads seeds 0-7, with bounds set
against the failure it guards (2-3 nodes, ARI 0.05-0.06) rather than at one pair of seeds:
a mean ARI of 0.08 and a mean of 3.2 occupied nodes (seed noise moves the mean of 8 seeds by
about 0.012 in ARI and 0.16 in nodes, so the failure sits 2 of those below the ARI bound).
"""

import numpy as np
import pytest
from sklearn.metrics import adjusted_rand_score

from streamtree.model import DTSSBP
from streamtree.synthetic import planted_dirichlet_tree


@pytest.mark.slow
def test_small_epochs_keep_a_tree_that_follows_the_planted_nodes():
    aris, occupied = [], []
    for seed in range(8):
        corpus = planted_dirichlet_tree(np.random.default_rng(seed), n_features=1000, n_documents=60, n_epochs=8,
                                        doc_length=(30, 100))
        model = DTSSBP(max_depth=3, random_state=seed)
        for t, X in enumerate(corpus.counts):
            tree = model.partial_fit(X, epoch=t).trees_[-1]
            if t == 0:
                continue  # the first epoch has no window behind it
            aris.append(adjusted_rand_score(corpus.labels[t], tree.assignments))
            occupied.append(int((tree.counts > 0).sum()))
    assert np.mean(occupied) >= 3.2, occupied
    assert np.mean(aris) >= 0.08, np.round(aris, 3)
