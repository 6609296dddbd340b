"""Numba kernels of the TMC sampler: Brownian message passing and the Gibbs moves.

Tree layout (``N = 2n - 1`` nodes): leaves ``0..n-1`` (time 0), internal nodes ``n..N-1``;
``parent[root] = -1``, ``ch[v] = (-1, -1)`` for leaves, ``t[root] = 1``. ``m[v]`` counts the
internal nodes in the subtree of ``v`` (0 for a leaf).

Messages (Brownian motion with covariance ``sigma2 * I`` per unit time, flat prior on the root
location): ``umean[v], uvar[v]`` is the upward message of the subtree of ``v`` located at ``v``,
a Gaussian with mean ``umean[v]`` and covariance ``sigma2 * uvar[v] * I`` (``uvar = 0`` at
leaves). ``omean[v], ovar[v]`` is the message from everything *outside* the subtree of ``v``,
located at ``parent[v]``.

Randomness: every move reads its uniforms from a block of a buffer drawn by the caller's
``numpy.random.Generator``. Slice-sampling shrinkage is capped at ``MAX_SHRINK`` proposals and
keeps the current point if none is accepted; truncating shrinkage keeps detailed balance because
the rejected proposals shrink the bracket identically from either end point (Neal 2003, 4.2).
"""

from __future__ import annotations

import math

import streamtree  # noqa: F401  (configures the numba cache directory)
import numpy as np
from numba import njit

LOG2PI = math.log(2.0 * math.pi)
MAX_SHRINK = 40
REGRAFT_BUDGET = 2 * (MAX_SHRINK + 1)
HEIGHT_BUDGET = MAX_SHRINK + 1
# branches whose midpoint density is this far below the best get a single proposal cell
REFINE_NATS = 25.0


@njit(cache=True)
def log_time_factor(tc, tp, a, b, lbeta_ab):
    """log density of an internal child's time ``tc`` given its parent's ``tp``.

    The branch fraction ``B = 1 - tc / tp ~ Beta(a, b)``; ``1 / tp`` is the Jacobian to time.
    """
    frac = 1.0 - tc / tp
    if frac <= 0.0 or frac >= 1.0:
        return -np.inf
    return (a - 1.0) * math.log(frac) + (b - 1.0) * math.log(tc / tp) - lbeta_ab - math.log(tp)


@njit(cache=True)
def postorder(ch, root, out):
    """Fill ``out`` with the subtree of ``root`` in post-order; return the node count."""
    stack = np.empty(out.shape[0] + 1, dtype=np.int64)
    top = 0
    stack[0] = root
    k = 0
    # reversed pre-order (node, right, left) is a valid post-order (children before parents)
    while top >= 0:
        v = stack[top]
        top -= 1
        out[k] = v
        k += 1
        if ch[v, 0] >= 0:
            top += 1
            stack[top] = ch[v, 0]
            top += 1
            stack[top] = ch[v, 1]
    out[:k] = out[:k][::-1].copy()
    return k


@njit(cache=True)
def _up_node(v, ch, t, umean, uvar):
    a = ch[v, 0]
    b = ch[v, 1]
    va = uvar[a] + t[v] - t[a]
    vb = uvar[b] + t[v] - t[b]
    s = va + vb
    uvar[v] = va * vb / s
    wa = vb / s
    wb = va / s
    for k in range(umean.shape[1]):
        umean[v, k] = wa * umean[a, k] + wb * umean[b, k]


@njit(cache=True)
def upward_all(ch, t, root, umean, uvar):
    """Upward messages of every internal node (leaf rows of ``umean`` hold the data)."""
    order = np.empty(ch.shape[0], dtype=np.int64)
    k = postorder(ch, root, order)
    for j in range(k):
        v = order[j]
        if ch[v, 0] >= 0:
            _up_node(v, ch, t, umean, uvar)


@njit(cache=True)
def upward_path(v, parent, ch, t, umean, uvar):
    """Recompute upward messages from ``v`` (internal) to the root."""
    while v >= 0:
        _up_node(v, ch, t, umean, uvar)
        v = parent[v]


@njit(cache=True)
def _out_child(v, parent, ch, t, umean, uvar, omean, ovar):
    """Outside message of ``v`` from its parent's outside message and its sibling."""
    p = parent[v]
    w = ch[p, 0] if ch[p, 1] == v else ch[p, 1]
    b = uvar[w] + t[p] - t[w]
    g = parent[p]
    d = umean.shape[1]
    if g < 0:
        ovar[v] = b
        for k in range(d):
            omean[v, k] = umean[w, k]
        return
    a = ovar[p] + t[g] - t[p]
    s = a + b
    ovar[v] = a * b / s
    for k in range(d):
        omean[v, k] = (b * omean[p, k] + a * umean[w, k]) / s


@njit(cache=True)
def outside_all(parent, ch, t, root, umean, uvar, omean, ovar, order):
    """Outside messages of every non-root node of the tree under ``root``; pre-order in ``order``.

    Returns the number of nodes written to ``order``.
    """
    stack = np.empty(order.shape[0] + 1, dtype=np.int64)
    top = 0
    stack[0] = root
    k = 0
    while top >= 0:
        v = stack[top]
        top -= 1
        order[k] = v
        k += 1
        if v != root:
            _out_child(v, parent, ch, t, umean, uvar, omean, ovar)
        if ch[v, 0] >= 0:
            top += 1
            stack[top] = ch[v, 1]
            top += 1
            stack[top] = ch[v, 0]
    return k


@njit(cache=True)
def outside_path(v, parent, ch, t, umean, uvar, omean, ovar):
    """Outside message of ``v`` (and of its ancestors) by walking down from the root."""
    path = np.empty(ch.shape[0], dtype=np.int64)
    k = 0
    u = v
    while parent[u] >= 0:
        path[k] = u
        k += 1
        u = parent[u]
    for j in range(k - 1, -1, -1):
        _out_child(path[j], parent, ch, t, umean, uvar, omean, ovar)


@njit(cache=True)
def log_likelihood(ch, t, root, umean, uvar, sigma2):
    """log p(X | tree, sigma2) with a flat prior on the root location (product of merge factors).

    Also returns ``sum_v ||yhat_a - yhat_b||^2 / (va + vb)``, the statistic of the conjugate
    inverse-Gamma update of ``sigma2``.
    """
    order = np.empty(ch.shape[0], dtype=np.int64)
    k = postorder(ch, root, order)
    d = umean.shape[1]
    ll = 0.0
    ssq = 0.0
    for j in range(k):
        v = order[j]
        if ch[v, 0] < 0:
            continue
        a = ch[v, 0]
        b = ch[v, 1]
        s = uvar[a] + t[v] - t[a] + uvar[b] + t[v] - t[b]
        dist = 0.0
        for q in range(d):
            diff = umean[a, q] - umean[b, q]
            dist += diff * diff
        ssq += dist / s
        ll += -0.5 * d * (LOG2PI + math.log(sigma2 * s))
    ll -= 0.5 * ssq / sigma2
    return ll, ssq


@njit(cache=True)
def log_time_prior(parent, ch, t, root, a, b, lbeta_ab):
    """sum over non-root internal nodes of ``log_time_factor`` and the branch fractions' logs."""
    total = 0.0
    slog_b = 0.0
    slog_1mb = 0.0
    count = 0
    for v in range(ch.shape[0]):
        if ch[v, 0] < 0 or v == root:
            continue
        tp = t[parent[v]]
        total += log_time_factor(t[v], tp, a, b, lbeta_ab)
        slog_b += math.log(1.0 - t[v] / tp)
        slog_1mb += math.log(t[v] / tp)
        count += 1
    return total, slog_b, slog_1mb, count


# --------------------------------------------------------------------------------------------
# attachment density of a pruned subtree on one branch
# --------------------------------------------------------------------------------------------


@njit(cache=True)
def _attach_logf(tt, ti, tpi, tl, ui, oi, ul, A, B, C, d, sigma2, i_internal, l_internal,
                 old_i, base, a, b, lbeta_ab):
    """log density (up to a constant) of attaching the pruned subtree at time ``tt``.

    ``base`` holds the branch's structure term; ``A, B, C`` are ``|yl - yi|^2``,
    ``|yl - oi|^2`` and ``(yl - yi).(yl - oi)`` so the Gaussian needs no O(d) work per point.
    """
    if tt <= ti or tt <= tl or tt >= tpi:
        return -np.inf
    # the Beta time factors written with as few logarithms as possible (hot path)
    ltt = math.log(tt)
    ltp = math.log(tpi)
    f = base + (a - 1.0) * (math.log(tpi - tt) - ltp) + (b - 1.0) * (ltt - ltp) - ltp - lbeta_ab
    if i_internal:
        f += (a - 1.0) * (math.log(tt - ti) - ltt) + (b - 1.0) * (math.log(ti) - ltt) - ltt \
            - lbeta_ab - old_i
    if l_internal:
        f += (a - 1.0) * (math.log(tt - tl) - ltt) + (b - 1.0) * (math.log(tl) - ltt) - ltt - lbeta_ab
    va = ui + tt - ti
    vb = oi + tpi - tt
    s = va + vb
    w1 = vb / s
    w2 = va / s
    c = va * vb / s + ul + tt - tl
    dist = w1 * w1 * A + w2 * w2 * B + 2.0 * w1 * w2 * C
    if dist < 0.0:
        dist = 0.0
    return f - 0.5 * d * (LOG2PI + math.log(sigma2 * c)) - 0.5 * dist / (sigma2 * c)


@njit(cache=True)
def _detach(l, parent, ch, m):
    """Remove ``l`` and its parent ``p`` from the tree; return ``(p, sibling)``."""
    p = parent[l]
    s = ch[p, 0] if ch[p, 1] == l else ch[p, 1]
    g = parent[p]
    if ch[g, 0] == p:
        ch[g, 0] = s
    else:
        ch[g, 1] = s
    parent[s] = g
    parent[p] = -1
    k = m[l] + 1
    u = g
    while u >= 0:
        m[u] -= k
        u = parent[u]
    return p, s


@njit(cache=True)
def _attach(l, p, i, tt, parent, ch, t, m):
    """Insert ``p`` (parent of ``l``) on the branch above ``i`` at time ``tt``."""
    q = parent[i]
    if ch[q, 0] == i:
        ch[q, 0] = p
    else:
        ch[q, 1] = p
    parent[p] = q
    ch[p, 0] = i
    ch[p, 1] = l
    parent[i] = p
    parent[l] = p
    t[p] = tt
    m[p] = m[i] + m[l] + 1
    k = m[l] + 1
    u = q
    while u >= 0:
        m[u] += k
        u = parent[u]


@njit(cache=True)
def attachment_tables(l, parent, ch, t, m, root, umean, uvar, omean, ovar, order, a, b, lbeta_ab):
    """Per-branch constants for attaching the detached subtree ``l`` to the tree under ``root``.

    Returns ``(nodes, base, A, B, C, old_i, lo, hi)`` over the branches above every non-root
    node of the remaining tree; ``base`` is the TMC structure term
    ``-log(m_i + k) - sum_{anc a of i} [log(m_a + k) - log m_a]`` with ``k = m_l + 1``
    (the change of ``-sum log m`` when the subtree is inserted above ``i``).
    """
    cnt = outside_all(parent, ch, t, root, umean, uvar, omean, ovar, order)
    d = umean.shape[1]
    kk = m[l] + 1
    cum = np.zeros(ch.shape[0])
    nb = cnt - 1
    nodes = np.empty(nb, dtype=np.int64)
    base = np.empty(nb)
    A = np.empty(nb)
    B = np.empty(nb)
    C = np.empty(nb)
    old_i = np.zeros(nb)
    lo = np.empty(nb)
    hi = np.empty(nb)
    j = 0
    for q in range(cnt):
        v = order[q]
        if v == root:
            continue
        pv = parent[v]
        # pre-order: the parent's cumulative term is final before its children are reached
        cum[v] = cum[pv] + math.log(m[pv] + kk) - math.log(m[pv])
        nodes[j] = v
        base[j] = -math.log(m[v] + kk) - cum[v]
        sa = 0.0
        sb = 0.0
        sc = 0.0
        for r in range(d):
            x1 = umean[l, r] - umean[v, r]
            x2 = umean[l, r] - omean[v, r]
            sa += x1 * x1
            sb += x2 * x2
            sc += x1 * x2
        A[j] = sa
        B[j] = sb
        C[j] = sc
        if ch[v, 0] >= 0:
            old_i[j] = log_time_factor(t[v], t[pv], a, b, lbeta_ab)
        lo[j] = max(t[v], t[l])
        hi[j] = t[pv]
        j += 1
    return nodes, base, A, B, C, old_i, lo, hi


@njit(cache=True)
def _branch_logf(j, tt, l, nodes, base, A, B, C, old_i, parent, ch, t, uvar, ovar, d, sigma2,
                 a, b, lbeta_ab):
    v = nodes[j]
    return _attach_logf(tt, t[v], t[parent[v]], t[l], uvar[v], ovar[v], uvar[l], A[j], B[j],
                        C[j], d, sigma2, ch[v, 0] >= 0, ch[l, 0] >= 0, old_i[j], base[j],
                        a, b, lbeta_ab)


@njit(cache=True)
def regraft(l, parent, ch, t, m, root, umean, uvar, omean, ovar, order, sigma2, a, b, lbeta_ab,
            n_grid, eps, u):
    """Gibbs update of where the subtree ``l`` hangs (its parent must not be the root).

    The conditional over (branch, time) is sampled by slice sampling twice:

    1. in the quantile coordinate of a piecewise-constant approximation ``q`` of the
       conditional ``f``: every branch is one cell valued at its midpoint, and branches whose
       midpoint is within ``REFINE_NATS`` of the best are split into ``n_grid`` cells; ``q`` is
       mixed with ``eps`` of the length-uniform density so ``q > 0`` wherever ``f > 0``. In that
       coordinate the target is ``f / q``, nearly flat, so shrinkage from the whole of
       ``[0, 1]`` moves across all branches at once;
    2. in time along the chosen branch (shrinkage from the whole branch), which refines the
       continuous attachment point.

    ``q`` depends only on the pruned subtree and the remaining tree, which every state reachable
    by this move shares, so both steps are exact slice-sampling updates of the same
    conditional. Returns 1 if the topology changed.
    """
    d = umean.shape[1]
    p, s = _detach(l, parent, ch, m)
    t0 = t[p]
    upward_path(parent[s], parent, ch, t, umean, uvar)
    nodes, base, A, B, C, old_i, lo, hi = attachment_tables(
        l, parent, ch, t, m, root, umean, uvar, omean, ovar, order, a, b, lbeta_ab)
    nb = nodes.shape[0]
    # screening: one midpoint per valid branch
    fmid = np.full(nb, -np.inf)
    valid = np.zeros(nb, dtype=np.bool_)
    j0 = -1
    best = -np.inf
    total_len = 0.0
    for j in range(nb):
        if nodes[j] == s:
            j0 = j
        if hi[j] <= lo[j]:
            continue
        valid[j] = True
        total_len += hi[j] - lo[j]
        fmid[j] = _branch_logf(j, 0.5 * (lo[j] + hi[j]), l, nodes, base, A, B, C, old_i, parent,
                               ch, t, uvar, ovar, d, sigma2, a, b, lbeta_ab)
        if fmid[j] > best:
            best = fmid[j]
    ncell_b = np.zeros(nb, dtype=np.int64)
    for j in range(nb):
        if valid[j]:
            ncell_b[j] = n_grid if (n_grid > 1 and fmid[j] > best - REFINE_NATS) else 1
    first = np.zeros(nb + 1, dtype=np.int64)
    for j in range(nb):
        first[j + 1] = first[j] + ncell_b[j]
    ncell = first[nb]
    cb = np.empty(ncell, dtype=np.int64)
    clo = np.empty(ncell)
    width = np.empty(ncell)
    logw = np.empty(ncell)
    for j in range(nb):
        G = ncell_b[j]
        if G == 0:
            continue
        wdt = (hi[j] - lo[j]) / G
        for g in range(G):
            c = first[j] + g
            cb[c] = j
            clo[c] = lo[j] + g * wdt
            width[c] = wdt
            if G == 1:
                fv = fmid[j]
            else:
                fv = _branch_logf(j, clo[c] + 0.5 * wdt, l, nodes, base, A, B, C, old_i, parent,
                                  ch, t, uvar, ovar, d, sigma2, a, b, lbeta_ab)
            logw[c] = fv + math.log(wdt)
    mx = np.max(logw)
    prob = np.empty(ncell)
    if mx > -np.inf:
        ssum = 0.0
        for c in range(ncell):
            prob[c] = math.exp(logw[c] - mx)
            ssum += prob[c]
        for c in range(ncell):
            prob[c] = (1.0 - eps) * prob[c] / ssum + eps * width[c] / total_len
    else:
        for c in range(ncell):
            prob[c] = width[c] / total_len
    cdf = np.cumsum(prob)
    cdf_total = cdf[-1]

    # current point in the quantile coordinate
    c0 = first[j0] + min(int((t0 - lo[j0]) / width[first[j0]]), ncell_b[j0] - 1)
    u0 = (cdf[c0] - prob[c0] + prob[c0] * (t0 - clo[c0]) / width[c0]) / cdf_total
    f0 = _branch_logf(j0, t0, l, nodes, base, A, B, C, old_i, parent, ch, t, uvar, ovar, d,
                      sigma2, a, b, lbeta_ab)
    y = f0 - math.log(prob[c0] / width[c0]) + math.log(u[0])
    left = 0.0
    right = 1.0
    jn = j0
    tn = t0
    for it in range(MAX_SHRINK):
        uu = left + u[1 + it] * (right - left)
        target = uu * cdf_total
        c = np.searchsorted(cdf, target, side="right")
        if c >= ncell:
            c = ncell - 1
        jj = cb[c]
        frac = (target - (cdf[c] - prob[c])) / prob[c]
        frac = min(max(frac, 0.0), 1.0)
        tt = clo[c] + frac * width[c]
        fval = _branch_logf(jj, tt, l, nodes, base, A, B, C, old_i, parent, ch, t, uvar, ovar, d,
                            sigma2, a, b, lbeta_ab) - math.log(prob[c] / width[c])
        if fval > y:
            jn = jj
            tn = tt
            break
        if uu < u0:
            left = uu
        else:
            right = uu

    # slice sampling of the time along the chosen branch
    off = MAX_SHRINK + 1
    f1 = _branch_logf(jn, tn, l, nodes, base, A, B, C, old_i, parent, ch, t, uvar, ovar, d,
                      sigma2, a, b, lbeta_ab)
    y = f1 + math.log(u[off])
    left = lo[jn]
    right = hi[jn]
    t1 = tn
    for it in range(MAX_SHRINK):
        tt = left + u[off + 1 + it] * (right - left)
        fval = _branch_logf(jn, tt, l, nodes, base, A, B, C, old_i, parent, ch, t, uvar, ovar, d,
                            sigma2, a, b, lbeta_ab)
        if fval > y:
            tn = tt
            break
        if tt < t1:
            left = tt
        else:
            right = tt

    i = nodes[jn]
    _attach(l, p, i, tn, parent, ch, t, m)
    upward_path(p, parent, ch, t, umean, uvar)
    return 1 if i != s else 0


@njit(cache=True)
def _height_logf(tt, tq, ta, tb, ua, ub, oj, Dab, Ao, Bo, Co, d, sigma2, a_int, b_int, a, b,
                 lbeta_ab):
    f = log_time_factor(tt, tq, a, b, lbeta_ab)
    if a_int:
        f += log_time_factor(ta, tt, a, b, lbeta_ab)
    if b_int:
        f += log_time_factor(tb, tt, a, b, lbeta_ab)
    if f == -np.inf:
        return f
    va = ua + tt - ta
    vb = ub + tt - tb
    s = va + vb
    f += -0.5 * d * (LOG2PI + math.log(sigma2 * s)) - 0.5 * Dab / (sigma2 * s)
    wa = vb / s
    wb = va / s
    c = va * vb / s + oj + tq - tt
    dist = wa * wa * Ao + wb * wb * Bo + 2.0 * wa * wb * Co
    if dist < 0.0:
        dist = 0.0
    return f - 0.5 * d * (LOG2PI + math.log(sigma2 * c)) - 0.5 * dist / (sigma2 * c)


@njit(cache=True)
def update_height(j, parent, ch, t, umean, uvar, omean, ovar, sigma2, a, b, lbeta_ab, u):
    """Slice-sample the time of the non-root internal node ``j`` given everything else."""
    d = umean.shape[1]
    outside_path(j, parent, ch, t, umean, uvar, omean, ovar)
    ca = ch[j, 0]
    cb = ch[j, 1]
    q = parent[j]
    Dab = 0.0
    Ao = 0.0
    Bo = 0.0
    Co = 0.0
    for r in range(d):
        x = umean[ca, r] - umean[cb, r]
        Dab += x * x
        x1 = umean[ca, r] - omean[j, r]
        x2 = umean[cb, r] - omean[j, r]
        Ao += x1 * x1
        Bo += x2 * x2
        Co += x1 * x2
    lo = max(t[ca], t[cb])
    hi = t[q]
    t0 = t[j]
    args_int = (ch[ca, 0] >= 0, ch[cb, 0] >= 0)
    f0 = _height_logf(t0, hi, t[ca], t[cb], uvar[ca], uvar[cb], ovar[j], Dab, Ao, Bo, Co, d,
                      sigma2, args_int[0], args_int[1], a, b, lbeta_ab)
    y = f0 + math.log(u[0])
    left = lo
    right = hi
    for it in range(MAX_SHRINK):
        tt = left + u[1 + it] * (right - left)
        if tt > lo and tt < hi:
            fval = _height_logf(tt, hi, t[ca], t[cb], uvar[ca], uvar[cb], ovar[j], Dab, Ao, Bo,
                                Co, d, sigma2, args_int[0], args_int[1], a, b, lbeta_ab)
            if fval > y:
                t[j] = tt
                break
        if tt < t0:
            left = tt
        else:
            right = tt
    upward_path(j, parent, ch, t, umean, uvar)


@njit(cache=True)
def sweep(prune_order, height_order, parent, ch, t, m, root, umean, uvar, sigma2, a, b,
          n_grid, eps, u):
    """One Gibbs sweep: prune-and-regraft every node of ``prune_order`` whose parent is not
    the root, then slice-sample the time of every node of ``height_order``.

    ``u`` holds ``REGRAFT_BUDGET`` uniforms per prune move followed by ``HEIGHT_BUDGET`` per
    height move. Returns ``(topology changes, regraft moves attempted)``.
    """
    lbeta_ab = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    N = ch.shape[0]
    omean = np.zeros_like(umean)
    ovar = np.zeros(N)
    order = np.empty(N, dtype=np.int64)
    moved = 0
    tried = 0
    pos = 0
    for l in prune_order:
        blk = u[pos:pos + REGRAFT_BUDGET]
        pos += REGRAFT_BUDGET
        if parent[l] < 0 or parent[l] == root:
            continue
        tried += 1
        moved += regraft(l, parent, ch, t, m, root, umean, uvar, omean, ovar, order, sigma2, a,
                         b, lbeta_ab, n_grid, eps, blk)
    for j in height_order:
        blk = u[pos:pos + HEIGHT_BUDGET]
        pos += HEIGHT_BUDGET
        update_height(j, parent, ch, t, umean, uvar, omean, ovar, sigma2, a, b, lbeta_ab, blk)
    return moved, tried


@njit(cache=True)
def predictive_components(parent, ch, t, m, root, umean, uvar, a, b, nodes_gl, weights_gl):
    """Mixture components of the density of a new leaf attached to the tree.

    For every branch (above each non-root node ``i``) and every Gauss-Legendre node ``tt`` on
    ``(t_i, t_parent)``, returns the log prior weight of attaching the new leaf there (TMC
    structure term, Beta time factors, quadrature weight) and the mean and variance (in units
    of ``sigma2``) of the new point: the branch point's posterior given all data, plus ``tt``.
    """
    lbeta_ab = math.lgamma(a) + math.lgamma(b) - math.lgamma(a + b)
    N = ch.shape[0]
    d = umean.shape[1]
    omean = np.zeros_like(umean)
    ovar = np.zeros(N)
    order = np.empty(N, dtype=np.int64)
    cnt = outside_all(parent, ch, t, root, umean, uvar, omean, ovar, order)
    cum = np.zeros(N)
    G = nodes_gl.shape[0]
    ncomp = (cnt - 1) * G
    logw = np.empty(ncomp)
    mean = np.empty((ncomp, d))
    var = np.empty(ncomp)
    c = 0
    for q in range(cnt):
        v = order[q]
        if v == root:
            continue
        pv = parent[v]
        cum[v] = cum[pv] + math.log(m[pv] + 1.0) - math.log(m[pv])
        struct = -math.log(m[v] + 1.0) - cum[v]
        lo = t[v]
        hi = t[pv]
        old = log_time_factor(t[v], hi, a, b, lbeta_ab) if ch[v, 0] >= 0 else 0.0
        for g in range(G):
            tt = lo + 0.5 * (nodes_gl[g] + 1.0) * (hi - lo)
            f = struct + log_time_factor(tt, hi, a, b, lbeta_ab)
            if ch[v, 0] >= 0:
                f += log_time_factor(t[v], tt, a, b, lbeta_ab) - old
            logw[c] = f + math.log(0.5 * weights_gl[g] * (hi - lo))
            va = uvar[v] + tt - t[v]
            vb = ovar[v] + hi - tt
            s = va + vb
            for r in range(d):
                mean[c, r] = (vb * umean[v, r] + va * omean[v, r]) / s
            var[c] = va * vb / s + tt
            c += 1
    return logw, mean, var
