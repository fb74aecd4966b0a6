"""RankCSE's ranking distillation (``aux=rank_distill``): ListNet, ListMLE and the ranking
consistency against direct computations, the term on a step's outputs with two weighted teachers,
the teachers' embeddings of the corpus, and the recipe's label."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from methods.ingredients import InvalidParams, StepOutputs
from methods.rankcse import RankDistillation, RankDistillParams, consistency, embed_rows, listmle, listnet
from methods.teachers import Teacher
from methods.recipe import Recipe, SharedParams


def _softmax(row: list[float]) -> list[float]:
    top = max(row)
    e = [math.exp(x - top) for x in row]
    return [x / sum(e) for x in e]


def slow_listnet(s, t) -> float:
    """Each row without its diagonal: -sum_j q_j log p_j, p and q the top-one probabilities."""
    n, total = len(s), 0.0
    for i in range(n):
        cols = [j for j in range(n) if j != i]
        p, q = _softmax([s[i][j] for j in cols]), _softmax([t[i][j] for j in cols])
        total += -sum(qj * math.log(pj) for pj, qj in zip(p, q))
    return total / n


def slow_listmle(s, t) -> float:
    """Plackett-Luce: the teacher's order (decreasing; ties by column) chosen one item at a time."""
    n, total = len(s), 0.0
    for i in range(n):
        order = sorted(range(n), key=lambda j: (-t[i][j], j))
        for k, j in enumerate(order):
            total += -(s[i][j] - math.log(sum(math.exp(s[i][m]) for m in order[k:])))
    return total / n


def slow_jsd(a, b) -> float:
    total = 0.0
    for x, y in zip(a, b):
        p, q = _softmax(list(x)), _softmax(list(y))
        m = [(pi + qi) / 2 for pi, qi in zip(p, q)]
        total += 0.5 * sum(pi * math.log(pi / mi) for pi, mi in zip(p, m)) + 0.5 * sum(qi * math.log(qi / mi)
                                                                                     for qi, mi in zip(q, m))
    return total / len(a)


def _lists(seed: int, n: int = 7):
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, n, generator=g, dtype=torch.float64) * 3, torch.randn(n, n, generator=g, dtype=torch.float64) * 3


def test_listnet_is_the_top_one_cross_entropy_without_the_diagonal():
    s, t = _lists(0)
    assert float(listnet(s, t)) == pytest.approx(slow_listnet(s.tolist(), t.tolist()), rel=1e-10)


def test_listmle_is_the_plackett_luce_likelihood_of_the_teachers_order_ties_by_column():
    s, t = _lists(1)
    t[2, 4] = t[2, 5]  # a tie (a sentence twice in a batch)
    assert float(listmle(s, t)) == pytest.approx(slow_listmle(s.tolist(), t.tolist()), rel=1e-10)


def test_consistency_is_the_jensen_shannon_divergence_of_the_two_views_lists():
    a, b = _lists(2)
    assert float(consistency(a, b)) == pytest.approx(slow_jsd(a.tolist(), b.tolist()), rel=1e-9)
    assert float(consistency(a, a)) == pytest.approx(0.0, abs=1e-12)


@pytest.mark.parametrize("rank_loss", ["listnet", "listmle"])
def test_the_term_pulls_the_students_list_towards_two_weighted_teachers(rank_loss):
    """gamma x distillation + beta x consistency: the student's list cos(h_i, h_j+) / tau2, the
    teachers' 0.3 cos(t_i, t_j) / tau3 + 0.7 cos(u_i, u_j) / tau3, the views' lists at the recipe's tau."""
    g = torch.Generator().manual_seed(3)
    a, p = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g)
    t, u = torch.randn(6, 5, generator=g), torch.randn(6, 12, generator=g)
    params = RankDistillParams(rank_teachers="one,two", rank_teacher_weights="0.3,0.7", rank_loss=rank_loss,
                               rank_weight=2.0, rank_consistency=0.5)
    term, metrics = RankDistillation(params, SharedParams()).forward(StepOutputs(
        None, 0, {}, {"anchor": a, "positive": p}, {"rank_teacher_0": t, "rank_teacher_1": u}))

    def cos(x, y):
        x, y = x.double(), y.double()
        return [[float(x[i] @ y[j] / (x[i].norm() * y[j].norm())) for j in range(len(y))] for i in range(len(x))]

    student = [[v / 0.05 for v in row] for row in cos(a, p)]
    teacher = [[(0.3 * v + 0.7 * w) / 0.025 for v, w in zip(r1, r2)] for r1, r2 in zip(cos(t, t), cos(u, u))]
    rank = (slow_listnet if rank_loss == "listnet" else slow_listmle)(student, teacher)
    agree = slow_jsd([[v / 0.05 for v in r] for r in cos(a, p)], [[v / 0.05 for v in r] for r in cos(p, a)])
    assert float(term) == pytest.approx(2.0 * rank + 0.5 * agree, rel=1e-5)
    assert float(metrics["rank_distillation"]) == pytest.approx(rank, rel=1e-5)


def test_the_teachers_embed_each_distinct_row_once_as_sentence_transformers_does(tiny_model, tmp_path):
    from sentence_transformers import SentenceTransformer

    from methods.encoder import Encoder, pretrained_source

    rows = ["a man plays a guitar .", "the cat sleeps .", "a man plays a guitar .", "rain tomorrow ."]
    got = embed_rows(rows, "minilm")
    source, kwargs = pretrained_source("minilm")
    want = SentenceTransformer(source, **kwargs).encode(rows[:2] + rows[3:])
    assert got.dtype == np.float16 and got.shape == (4, 384)
    assert np.allclose(got[[0, 1, 3]], want, atol=2e-3) and (got[0] == got[2]).all()
    # A training checkpoint's model, with the pooler it is evaluated with.
    encoder = Encoder.from_pretrained(str(tiny_model), pooler="avg")
    encoder.save_pretrained(tmp_path / "model")
    mine = Teacher(str(tmp_path / "model"), pooler="avg").encode(rows)
    assert np.allclose(mine, encoder.encode(rows).numpy(), atol=1e-5)


@pytest.mark.parametrize("device", [None, "cpu", "cuda"])
def test_a_teacher_lands_where_it_is_told_a_gpu_where_untold_and_batches_by_where_it_landed(tiny_model, tmp_path,
                                                                                           device):
    """32 sentences a batch on a CPU (a pool actor stays within its memory request), 128 on a GPU;
    a teacher named with no device, either kind, lands on the GPU where there is one."""
    from methods.encoder import Encoder

    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("no GPU here")
    Encoder.from_pretrained(str(tiny_model), pooler="avg").save_pretrained(tmp_path / "model")
    on_gpu = device == "cuda" or (device is None and torch.cuda.is_available())
    for teacher in (Teacher("minilm", device=device), Teacher(str(tmp_path / "model"), pooler="avg", device=device)):
        assert teacher.device.type == ("cuda" if on_gpu else "cpu") and teacher.batch_size == (128 if on_gpu else 32)
        assert teacher.encode(["a man plays a guitar ."]).dtype == np.float32
    assert Teacher("minilm", device=device, batch_size=7).batch_size == 7


def test_the_recipe_is_teacher_assisted_and_bad_settings_are_one_line():
    recipe = Recipe.named("simcse", aux="rank_distill", rank_teachers="minilm,sentence-transformers/all-mpnet-base-v2")
    assert recipe.supervision == "teacher-assisted (minilm, sentence-transformers/all-mpnet-base-v2)"
    for values, needle in (({"rank_teacher_weights": "1,1"}, "one weight > 0 for each of the 1"),
                           ({"rank_teacher_weights": "x"}, "one weight > 0"), ({"rank_loss": "lambda"}, "listnet or listmle"),
                           ({"rank_tau_student": 0}, "must be > 0"), ({"rank_teachers": " , "}, "names no teacher")):
        with pytest.raises(InvalidParams, match=needle):
            Recipe.named("simcse", aux="rank_distill", **values)
