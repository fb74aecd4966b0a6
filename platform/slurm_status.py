"""``python -m platform.cluster slurm status|logs|tunnel|cancel JOBID``: see and reach a job that
``python -m platform.cluster slurm`` submitted: its state, restarts and reason (``scontrol``, else
``sacct --duplicates``), its current start and Ray's nodes, MLflow's address, the tunnel lines (MLflow,
and Ray's dashboard, which listens on the first node's loopback: two hops), its log, or its end."""

from __future__ import annotations

import argparse
import json
import re
import shutil
import subprocess
from pathlib import Path

from platform.errors import ConfigError, UserError

ROOT = Path(__file__).resolve().parent.parent


def ask(*command: str) -> subprocess.CompletedProcess | None:
    """A Slurm command's answer; None where it is missing or does not answer within a minute."""
    if shutil.which(command[0]) is None:
        return None
    try:
        return subprocess.run(command, capture_output=True, text=True, timeout=60)
    except (OSError, subprocess.TimeoutExpired):
        return None


def slurm_state(job: str) -> dict[str, str]:
    """What Slurm says of the job: ``scontrol show job`` while the controller remembers it, else
    ``sacct`` (the last of its starts); empty when neither knows it."""
    proc = ask("scontrol", "show", "job", job)
    if proc is not None and proc.returncode == 0 and "JobState=" in proc.stdout:
        return dict(re.findall(r"(\w+)=(\S*)", proc.stdout))
    proc = ask("sacct", "-j", job, "--duplicates", "-X", "-n", "-P", "-o", "JobID,State,ExitCode,NodeList,Elapsed,Reason")
    if proc is not None:
        rows = [line.split("|") for line in proc.stdout.splitlines() if line.startswith(job)]
        if proc.returncode == 0 and rows:
            last = rows[-1] + [""] * 6
            return {"JobId": job, "JobState": last[1].split()[0], "ExitCode": last[2], "NodeList": last[3],
                    "RunTime": last[4], "Reason": last[5] or "None", "Restarts": str(len(rows) - 1)}
    return {}


def job_folder(job: str, state: dict[str, str], output: Path | None) -> Path | None:
    """The job's folder (``<output>/job-<first id>``, shared by the starts of one job and a successor
    that continues it), from ``--output``, the log Slurm writes to, or the repository's output folders."""
    roots = [output] if output else []
    if state.get("StdOut"):
        roots.append(Path(state["StdOut"].replace("%j", job)).parent)
    roots += sorted((ROOT / ".cluster").glob("slurm-*"))
    for root in filter(None, roots):
        for marker in root.glob("job-*/attempt-*/slurm-job-id"):
            if marker.read_text(encoding="utf-8").strip() == job:
                return marker.parent.parent
        if (root / f"job-{job}").is_dir():
            return root / f"job-{job}"
    return None


def attempts(folder: Path) -> list[Path]:
    return sorted((p for p in folder.glob("attempt-*") if p.name.split("-")[-1].isdigit()),
                  key=lambda p: int(p.name.split("-")[-1]))


def read_json(path: Path) -> dict | list:
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}


def status(job: str, state: dict[str, str], folder: Path | None) -> None:
    if not state and folder is None:
        raise UserError(f"Slurm knows no job {job} and no job folder names it: give --output DIR")
    if state:
        print(f"job {job}: {state.get('JobState', '?')}, restarts {state.get('Restarts', '0')}, reason "
              f"{state.get('Reason', 'None')}, nodes {state.get('NodeList', '?')}, run time {state.get('RunTime', '?')}, "
              f"exit code {state.get('ExitCode', '?')}")
    else:
        print(f"job {job}: Slurm no longer remembers it (its folder: {folder})")
    if folder is None:
        return
    starts = attempts(folder)
    if starts:
        current = starts[-1]
        ended = current / "ended"
        print(f"start: {len(starts)} ({current}), "
              + (f"ended with exit code {ended.read_text().strip()}" if ended.exists() else "running"))
        nodes = read_json(current / "nodes.json")
        for node in nodes if isinstance(nodes, list) else []:
            resources = node.get("Resources", {})
            print(f"ray node: {node.get('NodeManagerAddress', '?')} {'alive' if node.get('Alive') else 'dead'}, "
                  f"{resources.get('CPU', 0):g} CPUs, {resources.get('GPU', 0):g} GPUs")
        print(f"ray logs: {current / 'ray-logs'}")
    tunnels(folder)
    print(f"log: {state.get('StdOut', '').replace('%j', job) or folder.parent / f'slurm-{job}.out'}")


def tunnels(folder: Path) -> None:
    where, starts = read_json(folder / "where.json"), attempts(folder)
    if not where or (starts and where.get("start", starts[-1].name) != starts[-1].name):  # an earlier start's
        print(f"mlflow: not started yet{' in this start' if where else ''} (the job's first node prints its address "
              "once it runs)")
        return
    print(f"mlflow: {where['mlflow']} (user {where['user']}, password in {where['password_file']})")
    print(f"mlflow tunnel: {where['mlflow_tunnel']}, then http://127.0.0.1:5000")
    print(f"dashboard tunnel: {where['dashboard_tunnel']}, then http://127.0.0.1:8265 (Ray's token in "
          f"{where['ray_token_file']})")


def logs(job: str, state: dict[str, str], folder: Path | None, lines: int) -> None:
    path = Path(state["StdOut"].replace("%j", job)) if state.get("StdOut") else \
        (folder.parent / f"slurm-{job}.out" if folder else None)
    if path is None or not path.is_file():
        raise UserError(f"no log of job {job} found{f' at {path}' if path else ''}: give --output DIR")
    print("\n".join(path.read_text(encoding="utf-8", errors="replace").splitlines()[-lines:]))
    if folder is not None:
        kept = sorted(str(p.relative_to(folder)) for p in folder.glob("attempt-*/ray-logs/*"))
        print(f"ray logs kept under {folder}: {', '.join(kept) or 'none yet'}")


def cancel(job: str) -> None:
    proc = ask("scancel", job)
    if proc is None or proc.returncode != 0:
        why = " ".join(proc.stderr.split())[:200] if proc is not None else "scancel is not on PATH or did not answer"
        raise UserError(f"scancel {job} refused: {why}")
    print(f"job {job} cancelled: its command stops as Ctrl-C stops it (runs KILLED, resumable with the same command and "
          "--resume)")


def main(argv: list[str]) -> int:
    p = argparse.ArgumentParser(prog="python -m platform.cluster slurm",
                                description="See and reach a job the slurm verb submitted.")
    p.add_argument("verb", choices=["status", "logs", "tunnel", "cancel"])
    p.add_argument("job", metavar="JOBID")
    p.add_argument("--output", type=Path, default=None, help="the job's output folder (default: found from Slurm's log)")
    p.add_argument("--lines", type=int, default=40, help="logs: how many of the log's last lines (default 40)")
    args = p.parse_args(argv)
    if not args.job.isdigit():
        raise ConfigError(f"JOBID must be Slurm's job number, got {args.job!r}")
    if args.verb == "cancel":
        cancel(args.job)
        return 0
    state = slurm_state(args.job)
    folder = job_folder(args.job, state, args.output)
    if args.verb == "status":
        status(args.job, state, folder)
    elif args.verb == "logs":
        logs(args.job, state, folder, args.lines)
    elif folder is None:
        raise UserError(f"no folder of job {args.job} found: give --output DIR")
    else:
        tunnels(folder)
    return 0
