"""What several test modules share: running the commands as a user does, waiting, reading what
they wrote to MLflow, and a copy of the repository with an ingredient added the way
``docs/recipes.md`` says (its own file plus one registry line). The servers a test starts are in
``tests/services.py``; the slow reference computations of the losses in ``tests/reference.py``."""

from __future__ import annotations

import os
import shutil
import statistics
import subprocess
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# Two trials one after the other, lr 1e-3 then 1e-2 (far too large for the tiny BERT): ASHA's rung
# at the second evaluation compares them and stops the second.
ASHA_GRID_SPACE = """\
metric: stsb_dev_spearman
mode: max
search: grid
num_samples: 1
max_concurrent_trials: 1
seed: 0
scheduler: {type: asha, grace_period: 2, reduction_factor: 2}
space:
  lr: {grid: [1.0e-3, 1.0e-2]}
"""


# ------------------------------------------------------------------------------------------------
# Running the commands


def run_cli(module: str, *args: str, env: dict | None = None, timeout: int = 600, cwd: Path = ROOT
            ) -> subprocess.CompletedProcess:
    """Run ``python -m platform.<module> ...`` from the repository root, as a user would. A command
    still running after ``timeout`` seconds fails the test with what it printed and where each of
    its threads waits (its stacks, dumped on SIGUSR2), then is stopped as ``kill`` stops it."""
    import signal

    proc = start_cli(module, *args, env=env, cwd=cwd)
    try:
        out, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGUSR2)
        time.sleep(2)
        proc.terminate()  # SIGTERM: the command closes its runs as on Ctrl-C
        try:
            out, err = proc.communicate(timeout=60)
        except subprocess.TimeoutExpired:
            kill_group(proc)
            out, err = proc.communicate()
        kill_group(proc)
        raise AssertionError(f"`python -m platform.{module} {' '.join(args)}` still ran after {timeout} s; its threads "
                             f"then, and what it printed:\n--- stdout (last 40 lines) ---\n{_tail(out, 40)}\n"
                             f"--- stderr (last 120 lines) ---\n{_tail(err, 120)}") from None
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _tail(text: str | None, lines: int) -> str:
    return "\n".join((text or "").splitlines()[-lines:])


def run_main(module: str, *args: str, env: dict | None = None) -> subprocess.CompletedProcess:
    """``platform.<module>.main(argv)`` in this process, as ``python -m`` calls it, for commands
    that start no Ray (the process runtime, errors before Ray): an interpreter start costs ~5 s.
    The result looks like ``run_cli``'s; the environment is restored afterwards."""
    import contextlib
    import importlib
    import io

    import ray

    saved = {k: os.environ.get(k) for k in (env or {})}
    os.environ.update({k: str(v) for k, v in (env or {}).items()})
    out, err = io.StringIO(), io.StringIO()
    try:
        main = importlib.import_module("platform.data.fetch" if module == "data" else f"platform.{module}").main
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(args)) or 0
            except SystemExit as exc:
                code = exc.code
    finally:
        for key, value in saved.items():
            if value is None:
                os.environ.pop(key, None)
            else:
                os.environ[key] = value
    assert not ray.is_initialized(), "this command started Ray: test it with run_cli"
    return subprocess.CompletedProcess([module, *args], code, out.getvalue(), err.getvalue())


def start_cli(module: str, *args: str, env: dict | None = None, cwd: Path = ROOT) -> subprocess.Popen:
    """The same command in the background (to be signalled), its output in pipes, in a process
    group of its own (``kill_group`` ends what a killed driver leaves behind)."""
    return subprocess.Popen([sys.executable, "-m", f"platform.{module}", *args], cwd=cwd,
                            env={**os.environ, **(env or {})}, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True, start_new_session=True)


def kill_group(proc: subprocess.Popen) -> None:
    """SIGKILL to the command's process group: it and whatever of its local Ray outlived it."""
    import signal

    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def sets(**values) -> list[str]:
    """``--set key=value`` arguments."""
    return [a for k, v in values.items() for a in ("--set", f"{k}={v}")]


def assert_user_error(proc: subprocess.CompletedProcess, *needles: str) -> None:
    """Exit code 2, one 'error:' line on stderr naming the problem, no traceback."""
    assert proc.returncode == 2, (proc.returncode, proc.stderr[-2000:])
    assert "Traceback" not in proc.stderr, proc.stderr[-2000:]
    lines = [line for line in proc.stderr.splitlines() if line.startswith("error: ")]
    assert len(lines) == 1, proc.stderr[-2000:]
    for needle in needles:
        assert needle in lines[0], lines[0]


def corpus_head(corpus: Path, n: int, folder: Path) -> Path:
    """The first ``n`` sentences of ``corpus``, as a corpus file of their own in ``folder``."""
    path = folder / f"first{n}.txt"
    path.write_text("\n".join(corpus.read_text(encoding="utf-8").split("\n")[:n]) + "\n", encoding="utf-8")
    return path


def new_mlflow_db(template: Path, path: Path) -> str:
    """A fresh store at ``path`` (a copy of an empty one); its ``sqlite:///`` URI."""
    shutil.copyfile(template, path)
    return f"sqlite:///{path}"


def wait_for(what: str, condition, timeout: float = 300.0, proc: subprocess.Popen | None = None):
    """Poll ``condition()`` until it returns something true (returned); fail after ``timeout`` or
    when ``proc`` exits first."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        found = condition()
        if found:
            return found
        if proc is not None and proc.poll() is not None:
            out, err = proc.communicate()
            raise AssertionError(f"the command ended (exit {proc.returncode}) before {what}: {err[-3000:]}")
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


# ------------------------------------------------------------------------------------------------
# MLflow


def runs_of(uri: str, experiment: str = "simcse"):
    """``(client, runs)`` of an experiment (no runs when it does not exist)."""
    from mlflow.tracking import MlflowClient

    c = MlflowClient(uri)
    exp = c.get_experiment_by_name(experiment)
    return c, ([] if exp is None else c.search_runs([exp.experiment_id]))


def steps_of(client, run_id: str, key: str) -> list[int]:
    return sorted(m.step for m in client.get_metric_history(run_id, key))


def check_seed_means(parent, seed_runs) -> None:
    """The parent's scores are the seeds' mean and sample std, computed here directly."""
    import pytest

    for task in ["STS12", "STS13", "STS14", "STS15", "STS16", "STSBenchmark", "SICKRelatedness", "avg"]:
        values = [r.data.metrics[f"sts_{task}"] for r in seed_runs]
        assert parent.data.metrics[f"sts_{task}"] == pytest.approx(statistics.mean(values), abs=1e-6)
        assert parent.data.metrics[f"sts_{task}_std"] == pytest.approx(statistics.stdev(values), abs=1e-6)
    devs = [r.data.metrics["best_stsb_dev_spearman"] for r in seed_runs]
    assert parent.data.metrics["best_stsb_dev_spearman"] == pytest.approx(statistics.mean(devs), abs=1e-6)
    assert parent.data.metrics["best_stsb_dev_spearman_std"] == pytest.approx(statistics.stdev(devs), abs=1e-6)


# ------------------------------------------------------------------------------------------------
# Spawned gloo workers


def leave_process_group() -> None:
    """The end of a spawned gloo worker: every rank meets (none leaves while another still uses the
    store), the group goes, and the process exits at once. At interpreter finalization gloo's
    threads can abort the process ('terminate called without an active exception', SIGABRT: seen
    once in a suite run), which spawn reports as a failed worker after its results were saved."""
    import torch.distributed as dist

    dist.barrier()
    dist.destroy_process_group()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


# ------------------------------------------------------------------------------------------------
# The repository with an ingredient added (docs/recipes.md): its own file plus one registry line


def repo_with_ingredient(folder: Path, module: str, source: str, registry_line: str) -> Path:
    """A copy of the repository's code in ``folder`` with ``methods/<module>.py`` holding
    ``source`` and ``registry_line`` added to ``methods/registry.py``'s list; the commands run
    from it as from the repository (its Ray workers get this copy)."""
    files = subprocess.run(["git", "ls-files", "platform", "methods", "tune_spaces"], cwd=ROOT, capture_output=True,
                           text=True, check=True).stdout.split()
    for rel in files:
        (folder / rel).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / rel, folder / rel)
    (folder / "methods" / f"{module}.py").write_text(source, encoding="utf-8")
    registry = folder / "methods" / "registry.py"
    text = registry.read_text(encoding="utf-8")
    last = '    "methods.augcse:AugCSE",\n'
    assert last in text, "methods/registry.py no longer ends its list with AugCSE"
    registry.write_text(text.replace(last, last + registry_line.rstrip("\n") + "\n"), encoding="utf-8")
    return folder


BARRIER_SOURCE = ROOT / "tests" / "barrier.py"


def commits_step(snapshot: str | bytes, step: int) -> bool:
    """Whether a Ray Train controller's ``checkpoint_manager_snapshot.json`` (its text) has committed
    the checkpoint of ``step``: a fit resumes from those only. (The points of an evaluation reach
    MLflow live, before the commit: they say nothing of it.) False for a snapshot being written."""
    import json

    try:
        results = json.loads(snapshot)["checkpoint_results"]
    except (ValueError, KeyError, TypeError):
        return False
    return any(r.get("metrics", {}).get("step") == step for r in results)


def release_barrier(folder: Path, kill_held: bool = True) -> None:
    """Let runs past the barrier again; with ``kill_held`` the processes it holds are killed first
    (a driver killed with SIGKILL leaves its local Ray's workers running for a moment: here they
    die with it, as the whole machine would)."""
    import signal

    blocked = folder / "blocked"
    if kill_held and blocked.exists():
        for pid in {int(line) for line in blocked.read_text().split()}:
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            wait_for(f"process {pid} to exit", lambda pid=pid: not Path(f"/proc/{pid}").exists() or
                     Path(f"/proc/{pid}/stat").read_text().split()[2] == "Z", timeout=30)
    (folder / "armed").unlink()


def repo_with_barrier(folder: Path) -> Path:
    """The repository with ``aux=barrier`` (``tests/barrier.py``): a run that blocks at a step while
    a file says so, so that a test interrupts it mid-fit, at a known point, every time."""
    return repo_with_ingredient(folder, "barrier", BARRIER_SOURCE.read_text(encoding="utf-8"),
                                '    "methods.barrier:Barrier",')


def tiny_run_args(tiny_model, small_corpus, output: Path) -> list[str]:
    """A run of a few steps of the tiny model on one worker: what the cluster tests train."""
    return sets(model=tiny_model, corpus=small_corpus, batch_size=8, max_steps=4, eval_steps=2, log_steps=2,
                num_workers=1, use_gpu="false", output_dir=output)


def code_map() -> dict[str, str]:
    """The the Code map (docs/development.md): ``{file: its job}``, from its numbered lines ``N. `file` — job``."""
    import re

    section = (ROOT / "docs" / "development.md").read_text(encoding="utf-8").split("## Code map", 1)[1].split("\n## ", 1)[0]
    items = re.findall(r"^\d+\. `([\w/]+\.py)` — (.+(?:\n   .+)*)", section, flags=re.M)
    return {path: " ".join(job.split()) for path, job in items}




def byte_level_bpe(folder: Path, texts: list[str], vocab_size: int = 3000) -> Path:
    """A RoBERTa-style tokenizer (byte-level BPE, ``<s>``/``</s>``/``<pad>``/``<mask>``, the mask
    token absorbing the space before it) trained here on ``texts`` with the ``tokenizers``
    package: RoBERTa's leading-space tokens (``Ġword``) without a download."""
    import json

    from tokenizers import AddedToken, ByteLevelBPETokenizer
    from transformers import RobertaTokenizerFast

    folder.mkdir(parents=True, exist_ok=True)
    bpe = ByteLevelBPETokenizer(add_prefix_space=False)
    bpe.train_from_iterator(texts, vocab_size=vocab_size, show_progress=False,
                            special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"])
    bpe.save_model(str(folder))
    vocab = json.loads((folder / "vocab.json").read_text())
    merges = [tuple(line.split()) for line in (folder / "merges.txt").read_text().splitlines()[1:] if line]
    # vocab=/merges= (transformers 5 builds an empty vocabulary from vocab_file=); RoBERTa's <mask> lstrips.
    RobertaTokenizerFast(vocab=vocab, merges=merges, mask_token=AddedToken("<mask>", lstrip=True, special=True)
                         ).save_pretrained(folder)
    return folder


def build_tiny_roberta(folder: Path, texts: list[str], initializer_range: float = 0.02) -> Path:
    """A randomly initialised 2-layer 32-d RoBERTa (seed 0) with ``byte_level_bpe``'s tokenizer."""
    import torch
    from transformers import AutoTokenizer, RobertaConfig, RobertaModel

    tok = AutoTokenizer.from_pretrained(byte_level_bpe(folder, texts))
    config = RobertaConfig(vocab_size=len(tok), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                           intermediate_size=64, max_position_embeddings=514, pad_token_id=tok.pad_token_id,
                           bos_token_id=tok.bos_token_id, eos_token_id=tok.eos_token_id,
                           initializer_range=initializer_range)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        RobertaModel(config).save_pretrained(folder)
    return folder


def recipe_of(name: str, backbone: str):
    """The named recipe with its paper profile's settings for the backbone (paper: BERT, paper-roberta)."""
    from platform.config import TrainConfig

    return TrainConfig.build(name, "paper" if backbone == "bert" else "paper-roberta").build_recipe()
