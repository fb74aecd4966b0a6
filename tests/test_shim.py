"""The `platform` package re-exports the standard module; Ray workers import it via working_dir."""

from __future__ import annotations

import subprocess
import sys

from tests.conftest import ROOT


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


def test_ray_tasks_and_data_import_the_package(small_corpus):
    import ray

    from platform.ray_env import init_ray

    init_ray(num_cpus=2)
    try:
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
            from platform.cache import cache_root

            return str(cache_root())

        from platform.cache import cache_root

        # Workers run in a copy of the repository; they must share the driver's cache, not
        # start an empty one in that copy.
        assert ray.get(worker_cache_root.remote()) == str(cache_root())
    finally:
        ray.shutdown()
