"""What a cluster node downloads at its first boot, derived from the lock (requirements/), not timed
on AWS: for each locked package, the wheel pip picks for the nodes' Python (CPython 3.11,
manylinux_2_28 x86_64), its size from PyPI's JSON simple API (PEP 691); torch's CPU wheel from a
local folder of wheels when PyPI does not have it (its build lives on download.pytorch.org).

    python benchmarks/boot_bytes.py [--wheels /opt/wheels]

A node that was stopped and is started again (cache_stopped_nodes) downloads none of it: its venv
is on its disk, and pip finds every pin installed.
"""

from __future__ import annotations

import argparse
import json
import re
import sys
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from packaging.tags import compatible_tags, cpython_tags
from packaging.utils import canonicalize_name, parse_wheel_filename

ROOT = Path(__file__).resolve().parent.parent
PLATFORMS = [f"manylinux_2_{n}_x86_64" for n in range(28, 4, -1)] + ["manylinux2014_x86_64", "manylinux2010_x86_64",
                                                                     "manylinux1_x86_64", "linux_x86_64"]
TAGS = list(cpython_tags((3, 11), platforms=PLATFORMS)) + list(compatible_tags((3, 11), "cp311", PLATFORMS))
RANK = {tag: i for i, tag in enumerate(TAGS)}


def pins(path: Path) -> dict[str, str]:
    text = path.read_text(encoding="utf-8")
    return {canonicalize_name(m[1]): m[2] for m in re.finditer(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==(\S+)", text, re.M)}


def wheel_size(name: str, version: str, wheels: Path | None) -> tuple[int | None, str]:
    if wheels is not None:
        for local in wheels.glob("*.whl"):
            wname, wver, _, tags = parse_wheel_filename(local.name)
            if wname == name and str(wver) == version and any(t in RANK for t in tags):
                return local.stat().st_size, local.name
    request = urllib.request.Request(f"https://pypi.org/simple/{name}/",
                                     headers={"Accept": "application/vnd.pypi.simple.v1+json"})
    with urllib.request.urlopen(request, timeout=60) as response:
        files = json.load(response)["files"]
    best = None
    for f in files:
        if not f["filename"].endswith(".whl"):
            continue
        try:
            wname, wver, _, tags = parse_wheel_filename(f["filename"])
        except ValueError:  # old uploads with names today's rules refuse
            continue
        if str(wver) != version:
            continue
        rank = min((RANK[t] for t in tags if t in RANK), default=None)
        if rank is not None and (best is None or rank < best[0]):
            best = (rank, f)
    return (best[1]["size"], best[1]["filename"]) if best else (None, "no wheel: its sdist is built at install")


def total(locks: list[Path], wheels: Path | None) -> tuple[int, int, list[str]]:
    wanted = {}
    for lock in locks:
        wanted.update(pins(lock))
    with ThreadPoolExecutor(16) as pool:
        sizes = dict(zip(wanted, pool.map(lambda kv: wheel_size(kv[0], kv[1], wheels), wanted.items())))
    missing = [f"{n}=={wanted[n]}: {why}" for n, (size, why) in sizes.items() if size is None]
    largest = sorted(((s, n) for n, (s, _) in sizes.items() if s), reverse=True)[:5]
    return sum(s for s, _ in sizes.values() if s), len(wanted), missing + [f"largest: {n} {s / 1e6:.0f} MB"
                                                                           for s, n in largest]


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--wheels", type=Path, default=Path("/opt/wheels") if Path("/opt/wheels").is_dir() else None,
                   help="a folder of wheels PyPI lacks (torch's CPU build)")
    args = p.parse_args()
    req = ROOT / "requirements"
    for node, locks in (("head and CPU workers", [req / "torch-cpu.txt", req / "cpu.txt"]),
                        ("GPU workers", [req / "cuda.txt"])):
        size, count, notes = total(locks, args.wheels)
        print(f"{node}: {count} packages, {size / 1e9:.2f} GB of wheels at first boot")
        for note in notes:
            print(f"  {note}")
    print("plus, once per node: uv (requirements/uv.txt) and CPython 3.11.18 from uv's python-build-standalone "
          "(about 30 MB together); a restarted stopped node: none of it", file=sys.stdout)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
