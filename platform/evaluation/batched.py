"""SentEval's PyTorch logistic regression (``senteval/tools/classifier.py``, ``MLP`` with
``nhid = 0``) for many fits at once: the fits of a grid (L2 values x folds) advance together as
one tensor program, so an Adam step of every fit is a handful of batched kernels instead of one
Python-level optimizer step per fit.

What each fit does is what ``classifier.fit_pytorch`` does, one fit at a time:
- its weights start as ``nn.Linear(d, C)`` right after ``torch.manual_seed(seed)`` (the same for
  every fit of one shape, so they are drawn once);
- its NumPy generator is ``RandomState(seed)``: without given validation rows it first draws the
  5% hold-out, then a permutation of its training rows for every pass, batches of 64 in that order;
- each batch: cross-entropy (mean over the batch), its gradient, and ``torch.optim.Adam`` (lr 1e-3,
  betas (0.9, 0.999), eps 1e-8, L2 value as ``weight_decay`` added to the gradient) with the fit's
  own step count and moments;
- after ``epoch_size`` passes, accuracy on its validation rows; the best weights so far are kept,
  and it stops once that accuracy has failed to improve ``tenacity + 1`` times (never reset) or
  after ``max_epoch`` passes.

Fits with the same training and validation rows (the L2 values of one fold) draw the same
permutations, so they share each batch's features ("groups": one gather for K fits). A group with
no running fit leaves the batch.

Arithmetic: the forward pass, the gradient (written out: d(mean CE)/d(logits) = (softmax - onehot)
/ B, then X^T of it) and the Adam update are the serial engine's operations in the same order, but
batched matrix products round differently from single ones in the last bits, so a fit's weights
can drift by a few float32 ulps from the serial engine's. A validation accuracy is a count of
argmaxes; a drift flips a prediction only on a near-tie, and a flip can change an early-stopping
decision. ``tests/test_transfer.py`` checks the recorded SentEval references and the serial engine
on real task embeddings (see its tolerance).
"""

from __future__ import annotations

import dataclasses

import numpy as np

BETA1, BETA2, EPS, LR = 0.9, 0.999, 1e-8, 1e-3  # torch.optim.Adam's defaults, which SentEval keeps


@dataclasses.dataclass
class Fit:
    """One fit: train on ``train`` rows of the task matrix, stop early on ``validation`` rows
    (``None``: SentEval's 5% hold-out of the training rows), predict ``test`` rows."""

    train: np.ndarray
    test: np.ndarray
    l2: float
    validation: np.ndarray | None = None


def _device():
    import torch

    return torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")


def _initial_layer(d: int, nclasses: int, seed: int):
    import torch
    from torch import nn

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        layer = nn.Linear(d, nclasses)
    return layer.weight.detach().clone(), layer.bias.detach().clone()


def _predict(w, b, x):
    """Argmax classes: ``x`` [G, N, d], ``w`` [G, K, C, d], ``b`` [G, K, C] -> [G, K, N]."""
    import torch

    g, k, c, d = w.shape
    logits = torch.baddbmm(b.reshape(g, 1, k * c), x, w.reshape(g, k * c, d).transpose(1, 2))
    return logits.reshape(g, x.shape[1], k, c).argmax(-1).transpose(1, 2)


def _padded(rows: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
    """Index rows padded to the longest with row 0, and the mask of real entries."""
    n = max(len(r) for r in rows)
    idx = np.zeros((len(rows), n), dtype=np.int64)
    mask = np.zeros((len(rows), n), dtype=bool)
    for i, r in enumerate(rows):
        idx[i, : len(r)], mask[i, : len(r)] = r, True
    return idx, mask


def fit_and_score(x, y, nclasses: int, fits: list[Fit], cfg, split: float = 0.05, device=None) -> list[tuple]:
    """Accuracy and predictions on each fit's ``test`` rows, in the order of ``fits``."""
    import torch

    device = device or _device()
    groups: dict[tuple, list[int]] = {}
    for i, f in enumerate(fits):
        key = (f.train.tobytes(), None if f.validation is None else f.validation.tobytes())
        groups.setdefault(key, []).append(i)
    by_size: dict[int, list[list[int]]] = {}
    for members in groups.values():
        by_size.setdefault(len(members), []).append(members)
    out: list[tuple | None] = [None] * len(fits)
    xt = torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32)).to(device)
    yt = torch.from_numpy(np.asarray(y, dtype=np.int64)).to(device)
    for members in by_size.values():  # one program per number of L2 values a group holds
        for i, result in zip([i for m in members for i in m], _run(xt, yt, nclasses, fits, members, cfg, split)):
            out[i] = result
    return out


def _run(x, y, nclasses: int, fits: list[Fit], groups: list[list[int]], cfg, split: float) -> list[tuple]:
    import torch

    device = x.device
    G, K, C, d = len(groups), len(groups[0]), nclasses, x.shape[1]
    l2 = torch.tensor([[fits[i].l2 for i in m] for m in groups], dtype=torch.float32, device=device)
    rngs, train_rows, val_rows = [], [], []
    for m in groups:
        f = fits[m[0]]
        rng = np.random.RandomState(cfg.seed)  # SentEval: np.random.seed(seed) in the constructor
        train = f.train
        if f.validation is None:
            order = rng.permutation(len(train))
            cut = int(split * len(train))
            train, val = train[order[cut:]], train[order[:cut]]
        else:
            val = f.validation
        rngs.append(rng)
        train_rows.append(train)
        val_rows.append(val)

    w0, b0 = _initial_layer(d, C, cfg.seed)
    w = w0.to(device).expand(G, K, C, d).contiguous()
    b = b0.to(device).expand(G, K, C).contiguous()
    m_w, v_w, m_b, v_b = (torch.zeros_like(t) for t in (w, w, b, b))
    steps = torch.zeros(G, K, dtype=torch.float64, device=device)
    best_w, best_b = w.clone(), b.clone()
    best_acc = torch.full((G, K), -1.0, dtype=torch.float64, device=device)
    misses = torch.zeros(G, K, dtype=torch.int64, device=device)
    running = torch.ones(G, K, dtype=torch.bool, device=device)

    vidx, vmask = (torch.from_numpy(a).to(device) for a in _padded(val_rows))
    vx, vy = x[vidx], y[vidx]
    vcount = vmask.sum(1, keepdim=True).double()
    bs = cfg.batch_size
    epochs = 0
    while epochs <= cfg.max_epoch and bool(running.any()):
        live = running.any(1).nonzero().flatten().tolist()  # groups with a running fit
        for _ in range(cfg.epoch_size):
            perms = [train_rows[g][rngs[g].permutation(len(train_rows[g]))] for g in live]
            idx, mask = (torch.from_numpy(a).to(device) for a in _padded(perms))
            lw = torch.tensor(live, device=device)
            for start in range(0, idx.shape[1], bs):
                bmask = mask[:, start:start + bs]
                on = bmask[:, 0]  # the groups that still have a batch in this pass
                if not bool(on.all()):
                    sub = on.nonzero().flatten()
                    gi, bmask, rows = lw[sub], bmask[sub], idx[sub, start:start + bs]
                else:
                    gi, rows = lw, idx[:, start:start + bs]
                _adam_step(x[rows], y[rows], bmask, gi, running, w, b, m_w, v_w, m_b, v_b, steps, l2)
        epochs += cfg.epoch_size
        pred = _predict(w, b, vx)  # [G, K, V]
        acc = ((pred == vy[:, None, :]) & vmask[:, None, :]).sum(-1).double() / vcount
        better = running & (acc > best_acc)
        best_acc = torch.where(better, acc, best_acc)
        best_w = torch.where(better[..., None, None], w, best_w)
        best_b = torch.where(better[..., None], b, best_b)
        worse = running & ~better
        running = running & ~(worse & (misses >= cfg.tenacity))  # SentEval's count is never reset
        misses = misses + (worse & running).long()

    tidx, tmask = (torch.from_numpy(a).to(device) for a in _padded([fits[m[0]].test for m in groups]))
    pred = _predict(best_w, best_b, x[tidx])
    results = []
    for g in range(G):
        n = int(tmask[g].sum())
        truth = y[tidx[g, :n]]
        for k in range(K):
            p = pred[g, k, :n]
            results.append((p.eq(truth).sum().item() / n, p.cpu().numpy()))
    return results


def _adam_step(xb, yb, bmask, gi, running, w, b, m_w, v_w, m_b, v_b, steps, l2) -> None:
    """One Adam step of the running fits of groups ``gi`` on their batch ``xb`` [g, B, d]."""
    import torch

    g, B, d = xb.shape
    K, C = w.shape[1], w.shape[2]
    wg, bg = w[gi], b[gi]
    logits = torch.baddbmm(bg.reshape(g, 1, K * C), xb, wg.reshape(g, K * C, d).transpose(1, 2)).reshape(g, B, K, C)
    n = bmask.sum(1).to(xb.dtype)  # the batch's size (the last batch of a pass is short)
    dlogits = torch.softmax(logits, -1)
    dlogits -= torch.nn.functional.one_hot(yb, C).to(xb.dtype)[:, :, None, :]
    dlogits *= (bmask.to(xb.dtype) / n[:, None])[:, :, None, None]
    gw = torch.bmm(dlogits.reshape(g, B, K * C).transpose(1, 2), xb).reshape(g, K, C, d)
    gb = dlogits.sum(1)
    on = running[gi]  # fits that stopped keep their weights and their step count
    t = steps[gi] + on.double()
    steps[gi] = t
    decay = l2[gi]
    bc1 = (1 - BETA1 ** t).clamp_min(1e-300)
    bc2 = (1 - BETA2 ** t).clamp_min(1e-300)
    step_size = (LR / bc1).float()
    bc2_sqrt = bc2.sqrt().float()
    for p, grad, m, v, shape in ((w, gw, m_w, v_w, (g, K, 1, 1)), (b, gb, m_b, v_b, (g, K, 1))):
        pg, mg, vg = p[gi], m[gi], v[gi]
        grad = grad + decay.reshape(shape) * pg
        m_new = mg.lerp(grad, 1 - BETA1)
        v_new = vg * BETA2 + grad * grad * (1 - BETA2)
        denom = (v_new.sqrt() / bc2_sqrt.reshape(shape)) + EPS
        p_new = pg - step_size.reshape(shape) * (m_new / denom)  # addcdiv: value * (t1 / t2)
        keep = on.reshape(shape)
        p[gi] = torch.where(keep, p_new, pg)
        m[gi] = torch.where(keep, m_new, mg)
        v[gi] = torch.where(keep, v_new, vg)
