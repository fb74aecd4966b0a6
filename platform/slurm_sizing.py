"""What a Slurm job must ask for, read from the run it will run: ``--cpus-per-task`` and ``--mem``
from the command's resolved configuration (profile, ``--config``, ``--set``; a sweep's concurrency
from its search space), checked against the partition's largest node (``sinfo``) where Slurm
answers; and, inside the job, the same check against the nodes Ray sees. A site's default of one
CPU per task would otherwise leave a trial that asks Ray for 4 CPUs waiting forever."""

from __future__ import annotations

import argparse
import math
import shlex
from dataclasses import dataclass
from pathlib import Path

from platform.config import add_run_arguments, build_config
from platform.errors import ConfigError
from platform.slurm_status import ask
from platform.space import load_space

COMMANDS = ("train", "tune", "evaluate", "augment", "compare", "report")  # what a job may run: python -m platform.X

# Host memory a node is asked for (--mem, GiB): our estimates, not measurements at a site. Ray's own
# processes and object store on every node; the driver, Ray's head and MLflow on the first (every node
# is asked for the same); a Train worker (a base model's weights and optimiser state on the host
# side, tokenisation, a CUDA context); a trial's data pipeline and corpus columns.
MEM_GB = {"node": 4, "head": 4, "worker_gpu": 12, "worker_cpu": 4, "trial": 2}


def platform_command(command: list[str]) -> str:
    """The platform command COMMAND runs (``tune``, ``train``, ...); anything else is refused."""
    if len(command) >= 3 and Path(command[0]).name.startswith("python") and command[1] == "-m" \
            and command[2].removeprefix("platform.") in COMMANDS and command[2].startswith("platform."):
        return command[2].removeprefix("platform.")
    shown = shlex.join(command) if command else "nothing"
    raise ConfigError(f"COMMAND must be a platform command after --, such as python -m platform.tune una ... "
                      f"({', '.join(COMMANDS)}); got {shown[:120]}")


@dataclass(frozen=True)
class Needs:
    """What the command's runs ask Ray for at once."""
    workers: int  # Train workers of one trial
    cpus_per_worker: float
    gpu: bool  # one GPU per worker
    augment_cpus: float  # a trial's data pipeline tasks
    trials: int  # trials at once (1 for train)

    @property
    def least_cpus(self) -> float:
        """What one node must offer for a trial to start: a worker and its data pipeline."""
        return self.cpus_per_worker + self.augment_cpus

    def trial_line(self) -> str:
        gpu = f" and {self.workers} GPU(s)" if self.gpu else ""
        return (f"a trial needs {self.workers} worker(s) of {self.cpus_per_worker:g} CPUs{gpu}, plus "
                f"{self.augment_cpus:g} CPUs for its data pipeline ({self.least_cpus:g} CPUs on one node at least)")


def command_arguments(command: list[str]) -> argparse.Namespace:
    """COMMAND's run arguments (method, profile, --set, ...), ``--run-name``, ``--resume`` and a
    sweep's ``--space``/``--grid``/``--num-samples``, as the command itself reads them; its other
    options are left aside."""
    kind = platform_command(command)
    p = argparse.ArgumentParser(add_help=False)
    add_run_arguments(p, sweep=kind == "tune")
    p.add_argument("--run-name")
    p.add_argument("--resume", nargs="?", const=True)
    p.add_argument("--space", type=Path)
    p.add_argument("--grid")
    p.add_argument("--num-samples", type=int)
    return p.parse_known_args(command[3:])[0]


def run_needs(command: list[str]):
    """(the run's configuration, its ``Needs``) for ``train`` and ``tune``; (None, None) for the other
    commands, which the job does not size."""
    kind = platform_command(command)
    if kind not in ("train", "tune"):
        return None, None
    args = command_arguments(command)
    cfg = build_config(args)
    trials = 1
    if kind == "tune":
        spec = load_space(cfg, args.space, grid=args.grid)
        trials = max(1, min(spec.max_concurrent_trials, args.num_samples or spec.num_samples))
    return cfg, Needs(cfg.num_workers, cfg.cpus_per_worker, cfg.use_gpu, cfg.augment_cpus, trials)


def gres_gpus(gres: str) -> int:
    """The GPUs a GRES string names (``gpu:2``, ``gpu:a100:2``, sinfo's ``gpu:a100:4(S:0-1)``; a bare
    ``gpu`` is one), summed over its comma-separated items."""
    count = 0
    for item in filter(None, gres.split(",")):
        parts = item.split("(")[0].split(":")
        if parts[0] in ("gpu", "gres/gpu"):
            count += int(parts[-1]) if parts[-1].isdigit() else 1
    return count


@dataclass(frozen=True)
class Offer:
    """The largest node of a partition, as ``sinfo`` reports it (memory 0: not known to Slurm)."""
    partition: str
    cpus: int
    mem_mb: int
    gpus: int


def partition_offer(partition: str | None) -> Offer | None:
    """The partition's (or the default partition's) largest node; None where Slurm does not answer."""
    proc = ask("sinfo", "-h", "-N", "-o", "%P|%c|%m|%G")
    if proc is None or proc.returncode != 0:  # no Slurm here, or a controller that does not answer: not capped
        return None
    rows = [line.split("|") for line in proc.stdout.splitlines() if line.count("|") == 3]
    wanted = [r for r in rows if (r[0].rstrip("*") == partition if partition else r[0].endswith("*"))]
    if not wanted:
        return None
    # Memory of 1 MB is Slurm's "not configured" (RealMemory unset).
    return Offer(wanted[0][0].rstrip("*"), max(int(r[1].rstrip("+")) for r in wanted),
                 max((int(r[2].rstrip("+")) for r in wanted if r[2].rstrip("+").isdigit() and int(r[2].rstrip("+")) > 1),
                     default=0),
                 max(gres_gpus(r[3]) for r in wanted))


def size(needs: Needs, nodes: int, gpus: int, cpus_named: int | None, offer: Offer | None) -> tuple[int, int, str]:
    """(CPUs per task, memory per node in MiB, a line saying why) for ``nodes`` nodes of ``gpus``
    GPUs each; one line of ConfigError when a trial cannot fit on one node."""
    if needs.gpu and not gpus:
        raise ConfigError("the run trains on GPUs (use_gpu true) but the job asks Slurm for none: give --gpus-per-node "
                          "N (or --gres gpu:N), or --set use_gpu=false")
    workers = math.ceil(needs.trials * needs.workers / nodes)  # spread over the nodes, as Ray places them
    if needs.gpu:
        workers = min(workers, gpus)
    trials = min(needs.trials, max(1, math.ceil(workers / needs.workers)))
    cpus = max(1, math.ceil(workers * needs.cpus_per_worker + trials * needs.augment_cpus - 1e-9))
    mem_gb = MEM_GB["node"] + MEM_GB["head"] + workers * MEM_GB["worker_gpu" if needs.gpu else "worker_cpu"] \
        + trials * MEM_GB["trial"]
    least = math.ceil(needs.least_cpus - 1e-9)
    where = f"partition {offer.partition}'s largest node" if offer else ""
    if offer and least > offer.cpus:
        raise ConfigError(f"{needs.trial_line()}; {where} has {offer.cpus} CPUs: lower cpus_per_worker or "
                          "augment_cpus (--set), or choose another partition")
    if offer and needs.gpu and offer.gpus and gpus > offer.gpus:
        raise ConfigError(f"--gpus-per-node {gpus}, but {where} has {offer.gpus} GPUs")
    if cpus_named is not None and cpus_named < least:
        raise ConfigError(f"{needs.trial_line()}; --cpus-per-task {cpus_named} gives each node {cpus_named}: ask for "
                          f"{least} or more, or leave it out (the job is sized from the run)")
    why = (f"{workers} Train worker(s) x {needs.cpus_per_worker:g} CPUs + {trials} trial(s) x {needs.augment_cpus:g} "
           f"data-pipeline CPUs per node ({needs.trials} trial(s) at once over {nodes} node(s))")
    if offer and cpus > offer.cpus:
        cpus, why = offer.cpus, why + f", capped at {where}'s {offer.cpus} CPUs (fewer trials run at once)"
    mem_mb = mem_gb * 1024
    if offer and offer.mem_mb and mem_mb > offer.mem_mb:
        mem_mb, why = offer.mem_mb, why + f"; memory capped at {where}'s {offer.mem_mb} MiB"
    return cpus, mem_mb, why


def fits(needs: Needs, nodes: list[dict]) -> str | None:
    """Inside the job: why the Ray nodes (``ray.nodes()``' resources of the live nodes) cannot hold
    one trial, in one line; None when they can."""
    largest = max(nodes, key=lambda r: (r.get("GPU", 0), r.get("CPU", 0)), default={})
    can = [r for r in nodes if r.get("CPU", 0) + 1e-9 >= needs.least_cpus and (not needs.gpu or r.get("GPU", 0) >= 1)]
    total_cpus = sum(r.get("CPU", 0) for r in nodes)
    total_gpus = sum(r.get("GPU", 0) for r in nodes)
    enough = total_cpus + 1e-9 >= needs.workers * needs.cpus_per_worker + needs.augment_cpus and \
        (not needs.gpu or total_gpus >= needs.workers)
    if can and enough:
        return None
    return (f"the job's nodes cannot hold one trial: {needs.trial_line()}; the largest node offers "
            f"{largest.get('CPU', 0):g} CPUs and {largest.get('GPU', 0):g} GPUs ({len(nodes)} node(s), "
            f"{total_cpus:g} CPUs in all): resubmit without --cpus-per-task (sized from the run) or with more")
