"""The `platform` package re-exports the standard module; Ray workers import it via working_dir,
and the Ray Data generation pipeline built on it returns the corpus in order."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from tests.helpers import ROOT

pytestmark = pytest.mark.e2e


@pytest.fixture(scope="module")
def local_ray():
    """The platform's local Ray, started where a `ray start` that ended without `ray stop` left its
    address in Ray's temp folder (a port nothing listens on)."""
    from pathlib import Path

    import ray
    from ray._common.utils import get_ray_address_file

    from platform.run.ray_env import init_ray

    stale = Path(get_ray_address_file(None))
    before = stale.read_text() if stale.is_file() else None
    stale.parent.mkdir(parents=True, exist_ok=True)
    stale.write_text("127.0.0.1:9")
    # As a user's shell starts it: no OMP_NUM_THREADS (the suite's one thread per process), so that
    # Ray gives each task its own (its CPUs); the module's environment is restored after it.
    os.environ.pop("OMP_NUM_THREADS", None)
    try:
        init_ray(num_cpus=2)
        yield ray
        ray.shutdown()
    finally:
        if before is None:
            stale.unlink()
        else:
            stale.write_text(before)


def test_heavy_libraries_import_under_the_shim():
    code = (
        "import platform, torch, ray, mlflow, transformers, pickle;"
        "assert hasattr(platform, '__path__');"
        "u = pickle.loads(pickle.dumps(platform.uname())); print(platform.system(), u.system)"
    )
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert out.stdout.split() == ["Linux", "Linux"]


def test_stdlib_api_is_complete():
    import importlib.util
    import sysconfig

    import platform

    spec = importlib.util.spec_from_file_location("_std_platform", sysconfig.get_paths()["stdlib"] + "/platform.py")
    std = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(std)
    public = {n for n in dir(std) if not n.startswith("_")}
    assert public <= set(dir(platform))
    assert platform.python_version() == std.python_version()


def test_a_runs_end_on_cpu_takes_its_local_instances_cpus_and_torch_as_many_threads(local_ray):
    """(First on this Ray: its 2 CPUs free.) A run's end (``alone``) on CPU, on the local instance
    the command started, asks for all its CPUs and torch runs that many threads; otherwise a
    worker's CPUs and threads, also in a worker process that torch was first imported in with more
    (Ray reuses them)."""
    from platform.run.final_evaluation import on_device

    def _cpus_and_threads() -> tuple[float, int]:  # (local: pickled by value, for workers to run)
        import ray
        import torch

        return ray.get_runtime_context().get_assigned_resources().get("CPU", 0.0), torch.get_num_threads()

    device = {"runtime": "ray", "use_gpu": False, "cpus_per_worker": 0.4}
    assert local_ray.available_resources().get("CPU") == 2
    assert on_device(_cpus_and_threads, device=device) == (0.4, 1)
    assert on_device(_cpus_and_threads, device=device, alone=True) == (2.0, 2)
    assert on_device(_cpus_and_threads, device=device) == (0.4, 1)
    import torch

    threads = torch.get_num_threads()  # no Ray: this process, as it is
    assert on_device(torch.get_num_threads, device={**device, "runtime": "process"}, alone=True) == threads


def test_the_jobs_processes_ask_their_own_cluster(local_ray):
    """Ray's state API inside the job (Ray Train's placement-group cleaner polls it every second)
    finds this cluster, not the one the temp folder names. The job's processes (a Tune trial fits
    from one) also poll their Train workers' reports every 0.5 s, not Ray's 2 s."""
    import os

    from platform.settings import TRAIN_POLL as TRAIN_POLL_ENV

    ray = local_ray

    @ray.remote(num_cpus=0)
    class Probe:
        def state_of(self, actor_id: str):
            from ray.util.state import get_actor

            return os.environ.get("RAY_ADDRESS"), get_actor(actor_id, timeout=5).state, os.environ.get(TRAIN_POLL_ENV)

    probe = Probe.remote()
    address, state, poll = ray.get(probe.state_of.remote(probe._actor_id.hex()), timeout=120)
    assert address == ray.get_runtime_context().gcs_address
    assert state == "ALIVE"
    assert poll == "0.5"


def test_a_sweeps_end_releases_what_its_job_still_holds(local_ray):
    """``free_reservations`` (the end of every sweep) removes the placement groups the driver's
    job still holds, and only those: a group another job holds on the cluster stays."""
    from ray.util.placement_group import PlacementGroup, placement_group, placement_group_table, remove_placement_group
    from ray.util.state import list_placement_groups

    from platform.run.ray_env import free_reservations

    ray = local_ray
    ours = placement_group([{"CPU": 0.1}])
    ray.get(ours.ready(), timeout=60)
    gcs = ray.get_runtime_context().gcs_address
    other_job = subprocess.Popen([sys.executable, "-c", (
        "import ray, time; from ray.util.placement_group import placement_group;"
        f"ray.init(address={gcs!r}); g = placement_group([{{'CPU': 0.1}}], lifetime='detached');"
        "ray.get(g.ready()); print(g.id.hex(), flush=True); time.sleep(600)")],
        cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    theirs = ""
    try:
        theirs = other_job.stdout.readline().strip()
        assert theirs, "the other job made no placement group"
        assert free_reservations(settle_s=0) == [ours.id.hex()]
        assert placement_group_table(ours)["state"] == "REMOVED"
        states = {g.placement_group_id: g.state for g in list_placement_groups(address=gcs, detail=True)}
        assert states[theirs] == "CREATED"
    finally:
        other_job.kill()
        other_job.wait()
        if theirs:  # detached: it would outlive its job and hold a CPU share from this module's other tests
            remove_placement_group(PlacementGroup(ray.PlacementGroupID(bytes.fromhex(theirs))))


def test_a_sweeps_end_leaves_to_ray_train_what_its_cleaner_removes(local_ray):
    """A group of the job that is removed by another hand within the grace (Ray Train's cleaner removes
    a stopped fit's group about a second after its controller ends) is neither removed nor reported
    here: a sweep that ended normally prints no note about groups left reserved."""
    import threading

    from ray.util.placement_group import placement_group, placement_group_table, remove_placement_group

    from platform.run.ray_env import free_reservations

    ray = local_ray
    group = placement_group([{"CPU": 0.1}])
    ray.get(group.ready(), timeout=60)
    cleaner = threading.Timer(1.0, remove_placement_group, args=(group,))
    cleaner.start()
    try:
        assert free_reservations(settle_s=10) == []
    finally:
        cleaner.join()
    assert placement_group_table(group)["state"] == "REMOVED"


def test_ray_tasks_and_data_import_the_package(small_corpus, local_ray):
    ray = local_ray

    @ray.remote
    def count(path):
        import platform
        from platform.data import read_corpus

        return platform.system(), len(read_corpus(path))

    assert ray.get(count.remote(str(small_corpus))) == ("Linux", 256)

    from platform.data import read_corpus  # pickled by reference: the worker must import it

    ds = ray.data.from_items([{"path": str(small_corpus)}] * 2)
    rows = ds.map(lambda r: {"n": len(read_corpus(r["path"]))}).take_all()
    assert [r["n"] for r in rows] == [256, 256]

    @ray.remote
    def worker_cache_root():
        from platform.storage import cache_root

        return str(cache_root())

    from platform.storage import cache_root

    # Workers run in a copy of the repository; they must share the driver's cache, not
    # start an empty one in that copy.
    assert ray.get(worker_cache_root.remote()) == str(cache_root())


class SlowFirstBlock:
    """A generator whose first block finishes last (it sleeps), so rows come back out of order
    unless the pipeline puts them back."""

    def __init__(self, columns):
        self.columns = columns

    def __call__(self, batch):
        import time

        import numpy as np

        sentences = [str(s) for s in batch["sentence"]]
        if sentences[0].endswith(" 0."):
            time.sleep(3)
        return {**batch, self.columns[0]: np.asarray([s.upper() for s in sentences], dtype=object)}


def test_generation_over_several_blocks_keeps_corpus_order(small_corpus, local_ray):
    """Two actors at most, three blocks, two generators in one pass: rows come back in corpus
    order, each with its own outputs, the same as one process gives."""
    from platform.data.pipeline import BLOCK_SENTENCES, Generation, actor_bounds, generate_columns
    from platform.data import read_corpus

    base = read_corpus(small_corpus)
    sentences = [f"{s} It's {i}." for i, s in enumerate(base * 6)][: 2 * BLOCK_SENTENCES + 100]
    columns = ("aug_contraction_expansion", "aug_number_to_word")
    jobs = [Generation("methods.augmentations:AugmentationGenerator", {"columns": list(columns)}, columns, True),
            Generation("tests.platform.test_shim:SlowFirstBlock", {"columns": ["upper"]}, ("upper",), True)]
    assert actor_bounds(gpu=False, cpu_bound=True) == (1, 2)  # this Ray's 2 CPUs: no autoscaler config
    alone, pooled = (generate_columns(sentences, jobs, use_ray=use_ray, use_gpu=False) for use_ray in (False, True))
    as_lists = [[{c: v.to_pylist() for c, v in job.items()} for job in out] for out in (alone, pooled)]
    assert as_lists[0] == as_lists[1]
    augmented, slow = as_lists[1]
    assert sum(a != s for a, s in zip(augmented["aug_number_to_word"], sentences)) > 500
    assert slow["upper"] == [s.upper() for s in sentences]  # the slow first block put back in place
