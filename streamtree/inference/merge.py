"""The collapsed TSSB prior of an epoch's assignments (sticks integrated out).

Shared by the exact split-merge moves (:mod:`streamtree.inference.split_merge`), the
hyperparameter sampler (:mod:`streamtree.inference.hyper`) and the heat-bath merge of internal
nodes that the epoch sampler keeps as a search heuristic.
"""

from __future__ import annotations

import numpy as np
from scipy.special import betaln

from streamtree.inference.sticks import stick_params
from streamtree.tree import TreeArrays


def collapsed_log_prior(arrays: TreeArrays, past: np.ndarray, now: np.ndarray, *, alpha0: float, lam: float,
                        gamma: float, max_depth: int | None, root_holds_data: bool) -> float:
    """log p(z_t | counts of the window) with every stick integrated out (given child order).

    Parameters
    ----------
    past, now : ndarray (K,)
        Documents at each node in the window's past epochs and in the current epoch.
    """
    kw = dict(alpha0=alpha0, lam=lam, gamma=gamma, max_depth=max_depth, root_holds_data=root_holds_data)
    prior = stick_params(arrays, past, **kw)
    post = stick_params(arrays, past + now, **kw)
    free = np.isnan(post.nu_fixed)
    out = np.sum(betaln(post.a_nu[free], post.b_nu[free]) - betaln(prior.a_nu[free], prior.b_nu[free]))
    out += np.sum(betaln(post.a_psi[1:], post.b_psi[1:]) - betaln(prior.a_psi[1:], prior.b_psi[1:]))
    return float(out)
