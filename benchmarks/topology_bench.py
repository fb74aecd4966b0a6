"""Times the cluster of ``cluster.yaml`` reproduced on one machine (``tests.topology``): a
2-trial UNA sweep there and on one node, and one checkpoint's trip through the S3 endpoint;
with ``--end``, a sweep with its final evaluation there, and the driver's CPU time for its end
(issue 33, item 4: the weights are loaded by Ray tasks on the worker nodes, not by the driver).

    sudo -E python -m benchmarks.topology_bench [--steps 24] [--end]     # numbers in RESULTS.md
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from tests.topology import Topology, available

ROOT = Path(__file__).resolve().parent.parent


def _sweep(env: dict[str, str], sets: list[str]) -> float:
    cmd = [sys.executable, "-m", "platform.tune", "una", "--num-samples", "2"]
    for s in sets:
        cmd += ["--set", s]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, **env}, check=True, capture_output=True, text=True)
    print("".join(line + "\n" for line in proc.stdout.splitlines() if line.startswith("the end of the sweep")), end="")
    return time.perf_counter() - t0


def _end(args) -> int:
    """A 2-trial UNA sweep with its final evaluation, baseline, export and registration on the
    topology: the sweep's own line on its end's wall and driver CPU time."""
    with Topology(workers=2) as topo:
        seconds = _sweep(topo.client_env(), [f"max_steps={args.steps}", "data_pipeline=local",
                                             f"output_dir={topo.storage('end')}"])
    print(f"the whole sweep: {seconds:.1f} s")
    return 0


def _bench(args) -> int:
    """A 2-trial UNA sweep (local profile, 2 concurrent trials) on the topology and on one node; the
    checkpoint upload and download through the S3 endpoint."""
    sets = [f"max_steps={args.steps}", "final_eval=false", "data_pipeline=local"]
    with tempfile.TemporaryDirectory() as tmp:
        one = _sweep({"MLFLOW_TRACKING_URI": f"sqlite:///{tmp}/mlflow.db", "RAY_ADDRESS": ""},
                     [*sets, f"output_dir={tmp}/runs"])
    with Topology(workers=2) as topo:
        multi = _sweep(topo.client_env(), [*sets, f"output_dir={topo.storage()}"])
        up, down, size = _checkpoint_transfer(topo)
    print(f"2-trial UNA sweep, {args.steps} steps each: one node {one:.1f} s, topology {multi:.1f} s "
          f"({multi / one:.2f}x)")
    print(f"checkpoint ({size / 2**20:.1f} MiB) through the S3 endpoint: upload {up:.2f} s, download {down:.2f} s")
    return 0


def _checkpoint_transfer(topo: Topology) -> tuple[float, float, int]:
    """Upload and download of one checkpoint folder of the local profile's backbone, as Ray
    Train persists it and ``platform.storage.local_copy`` reads it back."""
    import pyarrow.fs as pafs

    from methods.encoder import Encoder
    from platform import checkpoint

    os.environ.update(topo.s3_env())
    with tempfile.TemporaryDirectory() as tmp:
        folder = Path(tmp) / "ckpt"
        checkpoint.save(folder, Encoder.from_pretrained("minilm"), {"step": 0})
        size = sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())
        fs, path = pafs.FileSystem.from_uri(topo.storage("bench/ckpt"))
        t0 = time.perf_counter()
        pafs.copy_files(str(folder), path, source_filesystem=pafs.LocalFileSystem(), destination_filesystem=fs)
        up = time.perf_counter() - t0
        t0 = time.perf_counter()
        pafs.copy_files(path, str(Path(tmp) / "back"), source_filesystem=fs, destination_filesystem=pafs.LocalFileSystem())
        down = time.perf_counter() - t0
    return up, down, size


def main(argv=None) -> int:
    p = argparse.ArgumentParser(prog="python -m benchmarks.topology_bench", description=__doc__.splitlines()[0])
    p.add_argument("--steps", type=int, default=24)
    p.add_argument("--end", action="store_true", help="only the sweep with its end (final evaluation, export)")
    args = p.parse_args(argv)
    why = available()
    if why:
        print(f"error: {why}", file=sys.stderr)
        return 1
    return _end(args) if args.end else _bench(args)


if __name__ == "__main__":
    sys.path.insert(0, str(ROOT))
    raise SystemExit(main())
