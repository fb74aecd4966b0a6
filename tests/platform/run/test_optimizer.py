"""The optimiser's update kernel: fused AdamW where torch has one, chosen in one place, and the
same training as the multi-tensor path it replaced."""

from __future__ import annotations

import pytest
import torch

from methods.encoder import Encoder
from platform import checkpoint
from platform.config import TrainConfig
from platform.run.loop import apply_step, forward_backward, make_optimizer, mixed_precision, optimizer_kernel

STEPS = 20
TOLERANCE = 1e-6


def _setup(tiny_model, small_corpus, tmp_path, **over):
    cfg = TrainConfig.build("simcse", "local", {"model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8,
                                                "output_dir": str(tmp_path), **over})
    recipe = cfg.build_recipe()
    torch.manual_seed(0)
    model = recipe.build(Encoder.from_pretrained(cfg.model, dropout=cfg.dropout), cfg.max_len, cfg.batch_size)
    return cfg, recipe, model


def _train(cfg, recipe, model, optimizer, schedule, steps: int) -> None:
    """The loop's own step, on a fixed batch of real token ids, dropout masks from a fixed seed."""
    autocast, scaler = mixed_precision(cfg.precision, torch.device("cpu"))
    tok = model.encoder.tokenizer
    enc = tok(["a man plays the guitar on a stage", "the cat sleeps", "rain fell all night in the city",
               "two dogs run", "she reads a book", "prices rose again", "the train left early", "a quiet morning"],
              padding=True, return_tensors="pt")
    batch = {"sentence": dict(enc)}
    model.train()
    torch.manual_seed(1)
    for step in range(steps):
        forward_backward(recipe, model, batch, step, 0, autocast, scaler, 1)
        apply_step(optimizer, schedule, scaler)
        optimizer.zero_grad(set_to_none=True)


def test_the_optimiser_is_fused_adamw_on_cpu_and_cuda_and_foreach_elsewhere(tiny_model, small_corpus, tmp_path):
    """What the loop builds (``make_optimizer``) runs torch's fused kernel on this CPU; CUDA gets
    it too; a device without one gets the multi-tensor path. Read from the optimiser's settings."""
    cfg, recipe, model = _setup(tiny_model, small_corpus, tmp_path)
    optimizer, _ = make_optimizer(cfg, recipe, model, 10)
    assert isinstance(optimizer, torch.optim.AdamW)
    assert optimizer.defaults["fused"] is True and not optimizer.defaults["foreach"]
    assert all(g["fused"] is True for g in optimizer.param_groups)
    assert optimizer_kernel(torch.device("cuda", 0)) == {"fused": True}
    assert optimizer_kernel(torch.device("cpu")) == {"fused": True}
    assert optimizer_kernel(torch.device("meta")) == {"foreach": True}
    vascl, vrecipe, vmodel = _setup(tiny_model, small_corpus, tmp_path, optimizer="adam")
    adam, _ = make_optimizer(vascl, vrecipe, vmodel, 10)
    assert type(adam) is torch.optim.Adam and adam.defaults["fused"] is True


def test_fused_adamw_trains_as_the_foreach_path_did(tiny_model, small_corpus, tmp_path):
    """Over 20 of the loop's steps from the same weights and seed, every parameter of the fused
    run is within 1e-6 (absolute; each step moves a weight by about lr, 3e-5) of the multi-tensor
    run's: the same AdamW, rounded differently. Changing the update itself (beta1 0.8 for 0.9)
    moves them over ten times further, so the bound says something."""
    runs = {}
    for name, kernel in (("foreach", {"foreach": True}), ("fused", {"fused": True}), ("other", {"foreach": True})):
        cfg, recipe, model = _setup(tiny_model, small_corpus, tmp_path)
        optimizer, schedule = make_optimizer(cfg, recipe, model, STEPS)
        for group in optimizer.param_groups:
            group.update({"fused": None, "foreach": None, **kernel})
            if name == "other":
                group["betas"] = (0.8, 0.999)
        _train(cfg, recipe, model, optimizer, schedule, STEPS)
        runs[name] = {k: v.detach().clone() for k, v in model.state_dict().items()}
    moved = max(float((runs["foreach"][k] - runs["other"][k]).abs().max()) for k in runs["foreach"])
    gap = max(float((runs["foreach"][k] - runs["fused"][k]).abs().max()) for k in runs["foreach"])
    assert gap <= TOLERANCE, gap  # 1.9e-8 on this CPU
    assert moved > 10 * TOLERANCE, moved  # 3.8e-5


def test_a_restored_optimiser_keeps_its_kernel_and_steps_on(tiny_model, small_corpus, tmp_path):
    """A state written by the multi-tensor optimiser (an older run, or another device) restores into
    the fused one: the moments and step counts come back, the kernel stays fused, and it steps."""
    cfg, recipe, model = _setup(tiny_model, small_corpus, tmp_path)
    old, schedule = make_optimizer(cfg, recipe, model, STEPS)
    for group in old.param_groups:
        group.update({"fused": None, "foreach": True})
    _train(cfg, recipe, model, old, schedule, 2)
    checkpoint.save_train_state(tmp_path, model, old, schedule, checkpoint.Position(step=2))
    new, new_schedule = make_optimizer(cfg, recipe, model, STEPS)
    checkpoint.load_train_state(tmp_path, 0, model, new, new_schedule)
    assert all(g["fused"] is True and not g["foreach"] for g in new.param_groups)
    p = next(iter(new.state))
    assert float(new.state[p]["step"]) == 2.0
    assert torch.equal(new.state[p]["exp_avg"], old.state[p]["exp_avg"])
    _train(cfg, recipe, model, new, new_schedule, 1)
    assert float(new.state[p]["step"]) == 3.0
    assert all(torch.isfinite(v).all() for v in model.state_dict().values() if v.is_floating_point())


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a GPU")
def test_fused_adamw_runs_on_cuda(tiny_model, small_corpus, tmp_path):
    cfg, recipe, model = _setup(tiny_model, small_corpus, tmp_path)
    model.cuda()
    optimizer, _ = make_optimizer(cfg, recipe, model, 10)
    assert optimizer.defaults["fused"] is True
