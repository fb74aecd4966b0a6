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
decision. ``tests/platform/evaluation/test_transfer.py`` checks the recorded SentEval references and the serial engine
on real task embeddings (see its tolerance).
"""

from __future__ import annotations

import dataclasses

import numpy as np

BETA1, BETA2, EPS, LR = 0.9, 0.999, 1e-8, 1e-3  # torch.optim.Adam's defaults, which SentEval keeps


@dataclasses.dataclass
class Probe:
    """One classifier to train: on ``train`` rows of the task matrix, stopping early on ``validation`` rows
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


def fit_and_score(x, y, nclasses: int, fits: list[Probe], cfg, split: float = 0.05, device=None) -> list[tuple]:
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


def _group_rows(fits: list[Probe], groups: list[list[int]], seed: int, split: float) -> tuple[list, list, list]:
    """Each group's NumPy generator (seeded as SentEval seeds every fit), training rows and
    validation rows (without given ones, the 5% hold-out its generator draws first)."""
    rngs, train_rows, val_rows = [], [], []
    for m in groups:
        f = fits[m[0]]
        rng = np.random.RandomState(seed)  # SentEval: np.random.seed(seed) in the constructor
        train, val = f.train, f.validation
        if val is None:
            order = rng.permutation(len(train))
            cut = int(split * len(train))
            train, val = train[order[cut:]], train[order[:cut]]
        rngs.append(rng)
        train_rows.append(train)
        val_rows.append(val)
    return rngs, train_rows, val_rows


class EarlyStopping:
    """SentEval's rule for every fit: the best weights by validation accuracy so far are kept, and
    a fit stops once its accuracy has failed to improve ``tenacity + 1`` times (never reset)."""

    def __init__(self, w, b, tenacity: int):
        import torch

        G, K = w.shape[:2]
        self.best_w, self.best_b, self.tenacity = w.clone(), b.clone(), tenacity
        self.best_acc = torch.full((G, K), -1.0, dtype=torch.float64, device=w.device)
        self.misses = torch.zeros(G, K, dtype=torch.int64, device=w.device)
        self.running = torch.ones(G, K, dtype=torch.bool, device=w.device)

    def update(self, live, acc, w, b) -> None:
        """The accuracies ``acc`` [len(live), K] of the groups ``live`` with weights ``w``, ``b``."""
        import torch

        run, best, miss = self.running[live], self.best_acc[live], self.misses[live]
        better = run & (acc > best)
        self.best_acc[live] = torch.where(better, acc, best)
        self.best_w[live] = torch.where(better[..., None, None], w, self.best_w[live])
        self.best_b[live] = torch.where(better[..., None], b, self.best_b[live])
        worse = run & ~better
        run = run & ~(worse & (miss >= self.tenacity))
        self.misses[live] = miss + (worse & run).long()
        self.running[live] = run


def _run(x, y, nclasses: int, fits: list[Probe], groups: list[list[int]], cfg, split: float) -> list[tuple]:
    import torch

    device = x.device
    G, C, d = len(groups), nclasses, x.shape[1]
    rngs, train_rows, val_rows = _group_rows(fits, groups, cfg.seed, split)
    w0, b0 = _initial_layer(d, C, cfg.seed)
    l2 = torch.tensor([[fits[i].l2 for i in m] for m in groups], dtype=torch.float32, device=device)
    passes = cfg.max_epoch + cfg.epoch_size
    state = AdamFits(w0.to(device), b0.to(device), l2, max_steps=passes * -(-max(map(len, train_rows)) // cfg.batch_size))
    stopping = EarlyStopping(state.w, state.b, cfg.tenacity)
    onehot = torch.nn.functional.one_hot(y, C).to(x.dtype)
    xa = augment(x)
    vidx, vm = (torch.from_numpy(a).to(device) for a in _padded(val_rows))
    vcount = vm.sum(1, keepdim=True).double()
    live = torch.arange(G, device=device)  # the groups in ``state``: those with a running fit
    vx, vy = x[vidx], y[vidx]
    bs, epochs = cfg.batch_size, 0
    while epochs <= cfg.max_epoch and len(live):
        state.keep = stopping.running[live].to(x.dtype)  # a stopped fit of a live group keeps its weights
        state.all_running = bool(stopping.running[live].all())
        for _ in range(cfg.epoch_size):
            perms = [train_rows[g][rngs[g].permutation(len(train_rows[g]))] for g in live.tolist()]
            idx, mask = (torch.from_numpy(a).to(device) for a in _padded(perms))
            shortest = min(len(p) for p in perms)  # batches before it are full ones in every group
            for start in range(0, idx.shape[1], bs):
                rows = idx[:, start:start + bs]
                g, n = rows.shape
                xb = xa.index_select(0, rows.reshape(-1)).view(g, n, d + 1)
                ob = onehot.index_select(0, rows.reshape(-1)).view(g, n, C)
                if start + bs <= shortest:
                    state.step(xb, ob)
                else:  # a short last batch, or groups whose pass has ended
                    bmask = mask[:, start:start + bs]
                    state.step(xb, ob, bmask, bmask[:, 0])
        epochs += cfg.epoch_size
        pred = _predict(state.w, state.b, vx)  # [live, K, V]
        stopping.update(live, ((pred == vy[:, None, :]) & vm[:, None, :]).sum(-1).double() / vcount[live],
                        state.w, state.b)
        still = stopping.running[live].any(1)
        if not bool(still.all()):  # groups whose fits all stopped leave the program
            keep = still.nonzero().flatten()
            live, vx, vy, vm = live[keep], vx[keep], vy[keep], vm[keep]
            state.select(keep)
    return _test_scores(x, y, fits, groups, stopping)


def _test_scores(x, y, fits: list[Probe], groups: list[list[int]], stopping: EarlyStopping) -> list[tuple]:
    """(accuracy, predictions) of each fit's best weights on its group's test rows."""
    import torch

    tidx, tmask = (torch.from_numpy(a).to(x.device) for a in _padded([fits[m[0]].test for m in groups]))
    pred = _predict(stopping.best_w, stopping.best_b, x[tidx])
    results = []
    for g in range(len(groups)):
        n = int(tmask[g].sum())
        truth = y[tidx[g, :n]]
        for k in range(len(groups[0])):
            p = pred[g, k, :n]
            results.append((p.eq(truth).sum().item() / n, p.cpu().numpy()))
    return results


class AdamFits:
    """G groups x K fits of a linear layer trained with mean cross-entropy and ``torch.optim.Adam``
    (Kingma & Ba, 2015, Algorithm 1, as PyTorch writes it: L2 added to the gradient, moments by
    ``lerp`` and ``addcmul``, ``param += -lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)``),
    each fit with its own moments and step count; the fits of a group see the same batch.

    A fit's weights and bias are one tensor ``p`` [G, K, C, d + 1] and its inputs carry a constant
    1 (``augment``), so that one product gives the logits with the bias and one Adam update covers
    both (SentEval's optimizer decays the bias too). ``keep`` [G, K]: 1 for a running fit, 0 for a
    stopped one (its weights stay as they are)."""

    def __init__(self, w0, b0, l2, max_steps: int):
        import torch

        G, K = l2.shape
        C, d = w0.shape
        self.p = torch.cat([w0, b0[:, None]], 1).expand(G, K, C, d + 1).contiguous()
        self.m, self.v = torch.zeros_like(self.p), torch.zeros_like(self.p)
        self.t = torch.zeros(G, dtype=torch.long, device=w0.device)
        self.l2 = l2
        self.keep = torch.ones(G, K, dtype=w0.dtype, device=w0.device)
        self.all_running = True  # no stopped fit among the groups: ``keep`` need not be applied
        # Adam's bias corrections by step count, computed in double precision as Python does and
        # rounded to float32 where PyTorch's kernels use them.
        t = np.arange(max_steps + 2, dtype=np.float64)
        t[0] = 1.0
        self.step_size = torch.from_numpy((LR / (1 - BETA1 ** t)).astype(np.float32)).to(w0.device)
        self.bc2_sqrt = torch.from_numpy(np.sqrt(1 - BETA2 ** t).astype(np.float32)).to(w0.device)

    @property
    def w(self):
        return self.p[..., :-1]

    @property
    def b(self):
        return self.p[..., -1]

    def select(self, groups) -> None:
        """Keep only ``groups`` (an index tensor) in the program."""
        for name in ("p", "m", "v", "t", "l2", "keep"):
            setattr(self, name, getattr(self, name).index_select(0, groups))

    def step(self, xb, onehot, bmask=None, on=None) -> None:
        """One Adam step of every running fit on its group's batch ``xb`` [G, B, d + 1] (rows of
        ``augment(x)``; ``onehot`` [G, B, C] its labels). ``bmask`` [G, B]: the batch's real rows
        (a short last batch); ``on`` [G]: the groups that take a step (a pass that ended for some)."""
        import torch

        g, B, d1 = xb.shape
        K, C = self.p.shape[1], self.p.shape[2]
        # Logits as [G, K*C, B]: the softmax then runs over C with the batch as its inner,
        # contiguous dimension (over a last dimension of 2, PyTorch's CPU softmax is 20x slower).
        logits = torch.bmm(self.p.view(g, K * C, d1), xb.transpose(1, 2))
        # d(mean cross-entropy)/d(logits) = (softmax - onehot) / batch size
        dlogits = torch.softmax(logits.view(g, K, C, B), 2).sub_(onehot.transpose(1, 2)[:, None])
        if bmask is None:
            dlogits.div_(B)
        else:
            real = bmask.to(xb.dtype)
            dlogits.mul_((real / real.sum(1, keepdim=True).clamp_min(1))[:, None, None, :])
        grad = torch.bmm(dlogits.view(g, K * C, B), xb).view(g, K, C, d1)
        self.t += 1 if on is None else on.long()
        shape = (g, K, 1, 1)
        ss = self.step_size[self.t].view(g, 1, 1, 1)
        bc = self.bc2_sqrt[self.t].view(g, 1, 1, 1)
        grad.add_(self.l2.view(shape) * self.p)  # torch.optim.Adam's weight_decay: L2 added to the gradient
        keep = None if self.all_running else self.keep.view(shape)
        p, m, v = self.p, self.m, self.v
        if on is None:
            m.lerp_(grad, 1 - BETA1)
            v.mul_(BETA2).addcmul_(grad, grad, value=1 - BETA2)
            update = (m / (v.sqrt().div_(bc).add_(EPS))).mul_(ss)
            p.sub_(update if keep is None else update.mul_(keep))
            return
        sel = on.view(g, 1, 1, 1)
        m_new = m.lerp(grad, 1 - BETA1)
        v_new = (v * BETA2).addcmul_(grad, grad, value=1 - BETA2)
        update = (m_new / (v_new.sqrt().div_(bc).add_(EPS))).mul_(ss)
        if keep is not None:
            update.mul_(keep)
        m.copy_(torch.where(sel, m_new, m))
        v.copy_(torch.where(sel, v_new, v))
        p.copy_(torch.where(sel, p - update, p))


def augment(x):
    """``x`` with a constant 1 appended to each row (the bias's input)."""
    import torch

    return torch.cat([x, torch.ones(x.shape[0], 1, dtype=x.dtype, device=x.device)], 1)
