"""Slow, direct reference computations of the losses, one term at a time: what each equation the
methods implement is checked against numerically."""

from __future__ import annotations

import math


def slow_info_nce(z1, z2, tau, negatives=None):
    """Gao et al. (2021) Eq. 1, one term at a time with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n = z1.shape[0]
    cols = [z2[j] for j in range(n)] + ([negatives[k] for k in range(negatives.shape[0])] if negatives is not None else [])
    total = 0.0
    for i in range(n):
        num = math.exp(cos(z1[i], z2[i]) / tau)
        den = sum(math.exp(cos(z1[i], c) / tau) for c in cols)
        total += -math.log(num / den)
    return total / n


def slow_hince(z1, z2, z3, t1, t2, w=1.0, valid=None):
    """HiNCE (Cai et al., Eq. 2) term by term with explicit cosines."""
    def cos(a, b):
        return float(a @ b) / (math.sqrt(float(a @ a)) * math.sqrt(float(b @ b)))

    n, total = len(z1), 0.0
    for i in range(n):
        terms = [math.exp(cos(z1[i], z2[j]) / t1) for j in range(n)]
        terms += [(w if j == i else 1.0) * math.exp(cos(z1[i], z3[j]) / t2) for j in range(n) if valid is None or valid[j]]
        total += -math.log(math.exp(cos(z1[i], z2[i]) / t1) / sum(terms))
    return total / n


def slow_neighbourhood_loss(q, p, negs, tau):
    """VaSCL's neighbourhood loss (Zhang et al., Eq. 2) one instance at a time with explicit dot
    products of unit vectors."""
    total = 0.0
    for i in range(len(q)):
        pos = math.exp(float(q[i] @ p[i]) / tau)
        den = pos + sum(math.exp(float(q[i] @ n) / tau) for n in negs[i])
        total += -math.log(pos / den)
    return total / len(q)


def slow_nt_xent(rows, partner, tau):
    """NT-Xent (SimCLR, Eq. 1): row i against every other row, its positive ``partner[i]``."""
    import torch

    total = 0.0
    for i, zi in enumerate(rows):
        sims = [float(torch.nn.functional.cosine_similarity(zi, zj, dim=0)) / tau for zj in rows]
        den = sum(math.exp(v) for j, v in enumerate(sims) if j != i)
        total += -(sims[partner[i]] - math.log(den))
    return total / len(rows)
