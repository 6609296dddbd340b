"""Merge moves: fold a node into its parent when the data do not support a separate node.

The enumerated sampler creates nodes one placeholder at a time, and with MAP parameters a
child can end up duplicating its parent (same parameter, documents split between the two by
mass alone), a mode that single-document moves leave only slowly. After each sweep every
non-root node ``c`` is offered a heat-bath choice between two configurations:

* split (as now): ``c``'s documents share a parameter drawn from the prior around the parent
  (collapsed: the group marginal ``m(X_c | theta_parent)``, the many-document version of the
  placeholder's new-node marginal);
* merged: ``c``'s documents sit at the parent with the parent's current parameter, and ``c``'s
  children become the parent's children in ``c``'s place.

The log odds add the change of the collapsed stick prior of the epoch's assignments (Beta
functions of windowed counts, sticks integrated out) to the data log Bayes factor. The links
of ``c``'s children are not rescored (their parameters are kept), so this is a heuristic move
of the MAP search, not an exact Gibbs step; it is what keeps duplicate chains from persisting.
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
