"""ESimCSE's ingredients (Wu et al., 2022): word repetition on sub-words (Sec. 3.1) and the momentum
queue (Sec. 3.2), each against a direct computation; the queue as state across steps (after the
optimiser's step, in a state checkpoint, restored), and the combinations it refuses."""

from __future__ import annotations

import io
import random

import pytest
import torch

from methods.encoder import Encoder
from methods.esimcse import MomentumState, most_repeats, repeat_tokens, repetition_count
from methods.ingredients import InvalidParams
from methods.recipe import Recipe, RecipeSpec
from platform.data.pipeline import StepInputs
from tests.recipe_reference import SENTENCES
from tests.reference import slow_info_nce


def _slow_repeat(ids: list[int], count: int, keys: list[float]) -> list[int]:
    """The authors' loop (``train.py``, ``dup_type=bpe``): the positions are the ``count`` smallest
    keys among 1..n-2, each token there written twice."""
    n = len(ids)
    eligible = sorted(range(1, n - 1), key=lambda j: keys[j])
    dup = set(eligible[:count])
    out = []
    for j, token in enumerate(ids):
        if j in dup:
            out.append(token)
        out.append(token)
    return out


@pytest.mark.parametrize("fidelity", ["paper", "authors_code"])
def test_repetition_equals_the_authors_loop_row_by_row(fidelity):
    g = torch.Generator().manual_seed(0)
    lengths = torch.tensor([2, 3, 5, 9, 17, 32, 32, 12])
    width = int(lengths.max())
    ids = torch.zeros(len(lengths), width, dtype=torch.long)
    for i, n in enumerate(lengths.tolist()):
        ids[i, :n] = torch.randint(5, 1000, (n,), generator=g)
    mask = (torch.arange(width)[None] < lengths[:, None]).long()
    inputs = {"input_ids": ids, "attention_mask": mask, "token_type_ids": torch.zeros_like(ids)}
    u, keys = torch.rand(len(lengths), generator=g), torch.rand(ids.shape, generator=g)
    counts = repetition_count(lengths, 0.32, u, fidelity)
    extra = most_repeats(width, 0.32, fidelity)
    out = repeat_tokens(inputs, counts, keys, extra)
    assert out["input_ids"].shape == (len(lengths), width + extra)
    for i, n in enumerate(lengths.tolist()):
        want = _slow_repeat(ids[i, :n].tolist(), int(counts[i]), keys[i].tolist())
        got_n = int(out["attention_mask"][i].sum())
        assert out["input_ids"][i, :got_n].tolist() == want
        assert got_n == n + int(counts[i]) and not out["input_ids"][i, got_n:].any()
        assert not out["token_type_ids"][i].any()


def test_the_number_of_repeats_is_the_papers_or_the_authors_draw():
    """Sec. 3.1: ``dup_len ~ uniform[0, max(2, int(dup_rate * N))]``, N the sentence's sub-words (at
    most N); the authors' code: ``random.randrange(min(10, int(dup_rate * n)))``, n with [CLS] and
    [SEP], nothing when that is 0. Every value of each range is drawn, none outside."""
    u = torch.rand(20000, generator=torch.Generator().manual_seed(1))
    for n in (3, 4, 8, 20, 32, 64):
        lengths = torch.full_like(u, n, dtype=torch.long)
        paper = set(repetition_count(lengths, 0.32, u, "paper").tolist())
        assert paper == set(range(0, min(max(2, int(0.32 * (n - 2))), n - 2) + 1)), n
        authors = set(repetition_count(lengths, 0.32, u, "authors_code").tolist())
        k = min(10, int(0.32 * n))
        assert authors == (set(range(k)) if k > 0 else {0}), n
        assert max(paper) <= most_repeats(n, 0.32, "paper") and max(authors) <= most_repeats(n, 0.32, "authors_code")
    assert max(repetition_count(torch.full_like(u, 32, dtype=torch.long), 0.32, u, "authors_code")) == \
        most_repeats(32, 0.32, "authors_code")
    random.seed(0)
    assert {random.randrange(min(10, int(0.32 * 32))) for _ in range(2000)} == set(range(10))


def test_the_momentum_update_and_the_queue_order_are_the_papers():
    """``theta_m <- lambda theta_m + (1 - lambda) theta`` for every parameter; the queue keeps the
    last ``queue_size`` embeddings, oldest first (``torch.cat((queue, z))[-size:]``)."""
    torch.manual_seed(0)
    online = torch.nn.Linear(4, 3)
    state = MomentumState(online, size=5, dim=3)
    before = [p.detach().clone() for p in state.encoder.parameters()]
    with torch.no_grad():
        for p in online.parameters():
            p.add_(1.0)
    state.follow(online, 0.9)
    for mine, old, new in zip(state.encoder.parameters(), before, online.parameters()):
        torch.testing.assert_close(mine, 0.9 * old + 0.1 * new)
        assert not mine.requires_grad
    pushed = [torch.randn(2, 3) for _ in range(4)]
    for z in pushed:
        state.push(z)
    torch.testing.assert_close(state.columns(), torch.cat(pushed)[-5:])
    assert state.filled == 5
    small = MomentumState(online, size=5, dim=3)
    small.push(pushed[0])
    torch.testing.assert_close(small.columns(), pushed[0])


def test_the_queue_is_every_anchors_extra_negatives_in_infonce():
    """InfoNCE with a queue: ``-log e^{s(h_i, h_i+)/tau} / (sum_j e^{s(h_i, h_j+)/tau} + sum_m e^{s(h_i, q_m)/tau})``."""
    from methods.losses import InfoNCE, Views
    from methods.recipe import SharedParams

    g = torch.Generator().manual_seed(3)
    a, p, q = torch.randn(6, 8, generator=g), torch.randn(6, 8, generator=g), torch.randn(10, 8, generator=g)
    loss = InfoNCE(None, SharedParams())(Views(a, p, [], q))
    assert float(loss) == pytest.approx(slow_info_nce(a.double(), p.double(), 0.05, q.double()), rel=1e-5)


def _esimcse(tiny_model, **values):
    encoder = Encoder.from_pretrained(str(tiny_model), dropout=0.1)
    recipe = Recipe.named("esimcse", **values)
    torch.manual_seed(0)
    model = recipe.build(encoder)
    inputs = StepInputs(recipe, str(tiny_model), 32)
    batch = inputs.nest(inputs.collate(inputs.arrays({"sentence": SENTENCES, "row": list(range(len(SENTENCES)))})))
    return recipe, model, batch


def _step(recipe, model, batch, step, optimizer):
    loss, metrics = recipe.loss(model, batch, step)
    loss.backward()
    optimizer.step()
    recipe.after_step(model)
    optimizer.zero_grad()
    return loss.item(), metrics


def test_the_queue_fills_with_the_momentum_encoders_embeddings_after_each_step(tiny_model):
    """After each optimiser step the batch's momentum embeddings (no dropout, through the projection)
    join the queue, and the next step's loss has them as columns; the momentum copy follows the
    stepped encoder; only the encoder is trained and exported."""
    recipe, model, batch = _esimcse(tiny_model, queue_size=12, momentum=0.9)
    state = model.states["momentum_queue"]
    trained = [p for p in model.parameters() if p.requires_grad]
    assert not {id(p) for p in state.parameters()} & {id(p) for p in trained}
    optimizer = torch.optim.SGD(recipe.param_groups(model, 0.1)[0]["params"], lr=0.1)
    frozen = [p.detach().clone() for p in state.encoder.parameters()]
    with torch.no_grad():
        state.encoder.eval()
        e = state.encoder(batch["sentence"], pooler=model.pool_with)
        model.projection.train()
        want = model.project({"anchor": e}, reference=["anchor"])["anchor"]
    _, metrics = _step(recipe, model, batch, 0, optimizer)
    assert metrics["momentum_queue_negatives"] == 0.0
    torch.testing.assert_close(state.columns(), want, rtol=1e-5, atol=1e-6)
    for mine, old, new in zip(state.encoder.parameters(), frozen, model.encoder.parameters()):
        torch.testing.assert_close(mine, 0.9 * old + 0.1 * new.detach())
    _, metrics = _step(recipe, model, batch, 1, optimizer)
    assert metrics["momentum_queue_negatives"] == len(SENTENCES) and state.filled == 12
    assert not any(k.startswith("states.") for k in recipe.export_encoder(model).state_dict())


def test_a_state_checkpoint_restores_the_queue_and_the_next_loss(tiny_model):
    """A run stopped after two steps and rebuilt from its state (``save_train_state`` saves the
    model's ``state_dict``) has the same queue, the same momentum copy and the same next loss."""
    recipe, model, batch = _esimcse(tiny_model, queue_size=12)
    optimizer = torch.optim.SGD([p for p in model.parameters() if p.requires_grad], lr=0.1)
    for step in range(2):
        _step(recipe, model, batch, step, optimizer)
    saved = io.BytesIO()
    torch.save(model.state_dict(), saved)
    saved.seek(0)
    again, restored, _ = _esimcse(tiny_model, queue_size=12)
    restored.load_state_dict(torch.load(saved, weights_only=True))
    a, b = model.states["momentum_queue"], restored.states["momentum_queue"]
    assert a.filled == b.filled == 12
    torch.testing.assert_close(a.columns(), b.columns())
    model.eval(), restored.eval()  # the same views: no dropout draw in the comparison
    torch.testing.assert_close(recipe.loss(model, batch, 2)[0], again.loss(restored, batch, 2)[0])


@pytest.mark.parametrize("kinds, needle", [
    ({"negatives": "momentum_queue", "loss": "ntxent"}, "loss=ntxent has no place for them"),
    ({"negatives": "momentum_queue", "loss": "hince"}, "use loss=infonce"),
    ({"negatives": "momentum_queue", "encoder": "prompt"}, "use encoder=plain"),
    ({"positives": "repetition", "encoder": "prompt"}, "positives=repetition works on the sentence's own sub-words"),
])
def test_combinations_that_cannot_work_are_refused_in_one_line(kinds, needle):
    with pytest.raises(InvalidParams, match=needle) as refused:
        RecipeSpec.parse(kinds).validate()
    assert "\n" not in str(refused.value)


def test_a_queue_with_replica_losses_is_refused():
    with pytest.raises(InvalidParams, match="queues the whole batch"):
        Recipe.named("esimcse", replicas=2)
