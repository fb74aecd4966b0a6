"""A new best model written in the background: the training thread copies the weights aside and
goes on; one write in flight; a failed write stops the run; a kill mid-write loses nothing named."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from methods.encoder import Encoder
from platform import checkpoint
from platform.config import TrainConfig
from platform.run.loop import train_loop_per_worker
from tests.helpers import ROOT


def _weights(folder: Path) -> dict[str, torch.Tensor]:
    return load_file(str(folder / "model.safetensors"))


def test_the_write_holds_the_weights_of_its_evaluation_and_a_newer_best_waits_for_it(tiny_model, tmp_path):
    """The weights written are the snapshot's, though training changed the live ones since; a
    second snapshot while the first write is in flight waits for it (one write at a time, the
    buffer reused), and the first folder is complete before the second snapshot returns."""
    encoder = Encoder.from_pretrained(str(tiny_model))
    writer = checkpoint.ModelWriter()
    first = writer.snapshot(encoder)
    taken = {k: v.clone() for k, v in encoder.backbone.state_dict().items()}
    gate, written = threading.Event(), []
    writer.submit(lambda: (gate.wait(), writer.write(first, tmp_path / "a")), lambda: written.append("a"))
    with torch.no_grad():
        for p in encoder.backbone.parameters():
            p.add_(1.0)  # training goes on while the write waits
    second: list = []
    waiter = threading.Thread(target=lambda: second.append(writer.snapshot(encoder)))
    waiter.start()
    time.sleep(0.5)
    assert not second and not written  # the newer best waits for the write in flight
    gate.set()
    waiter.join(timeout=30)
    assert second and written == ["a"]
    saved = _weights(tmp_path / "a")
    assert saved.keys() == taken.keys()
    assert all(torch.equal(saved[k], taken[k]) for k in taken)
    writer.write(second[0], tmp_path / "b")
    assert all(torch.equal(_weights(tmp_path / "b")[k], taken[k] + 1.0) for k in taken if taken[k].is_floating_point())
    loaded = Encoder.from_pretrained(str(tmp_path / "b"))
    assert loaded.tokenizer.vocab_size == encoder.tokenizer.vocab_size
    assert len(writer.blocked_s) == 2 and writer.blocked_s[1] >= 0.4
    writer.close()


def test_a_failed_write_reaches_the_caller_and_frees_the_buffer(tiny_model, tmp_path):
    """A write that fails (here: its folder's place is a file) raises at ``collect``, never
    leaving the run to go on without its checkpoint; the buffer is free for the next best."""
    encoder = Encoder.from_pretrained(str(tiny_model))
    writer = checkpoint.ModelWriter()
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    snap = writer.snapshot(encoder)
    then: list = []
    writer.submit(lambda: writer.write(snap, blocked / "model"), lambda: then.append(1))
    with pytest.raises(OSError):
        writer.collect(wait=True)
    assert not then
    done = threading.Thread(target=writer.snapshot, args=(encoder,))
    done.start()
    done.join(timeout=10)
    assert not done.is_alive()
    writer.close()


def test_a_run_whose_model_write_fails_fails(tiny_model, small_corpus, tmp_path, monkeypatch):
    """Through the loop (process runtime): the disk refusing a best model's write ends the run
    with that error, and no checkpoint folder is named without its model."""
    original = Encoder.save_pretrained
    calls = []

    def failing(self, directory, state_dict=None):
        calls.append(directory)
        if len(calls) == 1:  # the first evaluation's best
            raise OSError(28, "No space left on device")
        return original(self, directory, state_dict)

    monkeypatch.setattr(Encoder, "save_pretrained", failing)
    cfg = TrainConfig.build("simcse", "local", {
        "model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8, "max_steps": 24, "eval_steps": 2,
        "output_dir": str(tmp_path), "checkpoint_minutes": 60, "seed": 3})
    with pytest.raises(OSError, match="No space left"):
        train_loop_per_worker(cfg.flat())
    assert len(calls) == 1
    assert checkpoint.best_under(str(tmp_path / "local")) is None  # nothing named a best without its model


KILLED_RUN = textwrap.dedent("""
    import sys, time
    from pathlib import Path
    from methods.encoder import Encoder
    from platform.checkpoint import Position
    from platform.config import TrainConfig
    from platform.run.loop import train_loop_per_worker

    marker = Path(sys.argv[3])
    original = Encoder.save_pretrained
    calls = []

    def slow(self, directory, state_dict=None):  # the second best: half its weights written, then hung
        calls.append(directory)
        if len(calls) < 2:
            return original(self, directory, state_dict)
        Path(directory).mkdir(parents=True)
        (Path(directory) / "model.safetensors").write_bytes(b"partial")
        marker.write_text(str(directory))
        time.sleep(600)

    def always(self, dev):  # every evaluation a new best: the second one's write is the one cut
        self.best, self.best_step = dev, self.step
        return True

    Encoder.save_pretrained, Position.improve = slow, always
    cfg = TrainConfig.build("simcse", "local", {
        "model": sys.argv[1], "corpus": sys.argv[2], "batch_size": 8, "max_steps": 16, "eval_steps": 2,
        "output_dir": sys.argv[4], "checkpoint_minutes": 0, "seed": 3})
    train_loop_per_worker(cfg.flat())
""")


def test_a_process_killed_mid_write_leaves_the_previous_best_complete_and_named(tiny_model, small_corpus, tmp_path):
    """SIGKILL while a new best's weights are being written: the earlier best stays, complete and
    the fit's best (``best_under``); the half-written one is a ``.tmp-`` folder no reader takes;
    the run resumed from its latest state removes it and ends with a complete best."""
    marker, out = tmp_path / "writing", tmp_path / "run"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    proc = subprocess.Popen([sys.executable, "-c", KILLED_RUN, str(tiny_model), str(small_corpus), str(marker), str(out)],
                            cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.monotonic() + 240
        while not marker.exists():
            assert proc.poll() is None, proc.stdout.read()
            assert time.monotonic() < deadline, "no second best in 240 s"
            time.sleep(0.2)
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
    run_dir = out / "local"
    half = Path(marker.read_text())
    assert ".tmp-" in half.parent.name  # the checkpoint being written has no name yet
    best = checkpoint.best_under(str(run_dir))
    assert best is not None and ".tmp-" not in best.checkpoint
    state = checkpoint.read_state(best.checkpoint)
    assert state["stsb_dev_spearman"] == best.dev and state["step"] == 2  # the first evaluation's
    Encoder.from_pretrained(str(checkpoint.model_dir(best.checkpoint)))  # complete: it loads, strictly
    for folder in run_dir.glob("checkpoint_*"):
        if ".tmp-" not in folder.name and (folder / "model").exists():
            Encoder.from_pretrained(str(folder / "model"))

    cfg = TrainConfig.build("simcse", "local", {
        "model": str(tiny_model), "corpus": str(small_corpus), "batch_size": 8, "max_steps": 16, "eval_steps": 2,
        "output_dir": str(out), "checkpoint_minutes": 0, "seed": 3})
    result = train_loop_per_worker(cfg.flat())
    assert result["steps"] == 16
    assert not [p for p in run_dir.iterdir() if ".tmp-" in p.name]
    final = checkpoint.best_under(str(run_dir))
    assert final.dev >= best.dev
    Encoder.from_pretrained(str(checkpoint.model_dir(final.checkpoint)))
