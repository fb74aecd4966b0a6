"""``aux=barrier``: a test ingredient that adds nothing to the loss and holds training at one step
while a file says so. Tests copy it into a copy of the repository as ``methods/barrier.py`` with
its registry line (``tests.helpers.repo_with_barrier``), so every process of a run has it: the
command, Tune's trials, Ray Train's workers. A test arms the barrier by creating
``<barrier_dir>/armed``; every process reaching the step numbered ``barrier_step`` then adds its
pid to ``<barrier_dir>/blocked`` and waits until ``armed`` is gone, so the test interrupts the
run mid-fit at a known point, every time."""

from __future__ import annotations

import dataclasses
import os
import time

import torch

from methods.ingredients import AuxTerm, Params, StepOutputs, check


@dataclasses.dataclass
class BarrierParams(Params):
    barrier_dir: str = ""  # where the armed and blocked files are
    barrier_step: int = 1  # the step (1-based) that waits
    barrier_backward_s: float = 0.0  # seconds every backward pass sleeps

    def validate(self) -> None:
        check([(bool(self.barrier_dir), "aux=barrier needs barrier_dir"),
               (self.barrier_step >= 1, f"barrier_step must be >= 1, got {self.barrier_step}")])


class Barrier(AuxTerm):
    name = "barrier"
    Params = BarrierParams
    cites = "a test ingredient (tests/barrier.py)"

    def forward(self, out: StepOutputs):
        armed = os.path.join(self.params.barrier_dir, "armed")
        if out.step + 1 == self.params.barrier_step and os.path.exists(armed):
            with open(os.path.join(self.params.barrier_dir, "blocked"), "a") as f:
                f.write(f"{os.getpid()}\n")
            while os.path.exists(armed):
                time.sleep(0.1)
        zero = out.e["anchor"].sum() * 0.0
        return (SlowBackward.apply(zero, self.params.barrier_backward_s) if self.params.barrier_backward_s else zero), {}


class SlowBackward(torch.autograd.Function):
    """The identity, whose gradient takes ``seconds``: the autograd engine waits in Python."""

    @staticmethod
    def forward(ctx, x, seconds):
        ctx.seconds = seconds
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        time.sleep(ctx.seconds)
        return grad, None
