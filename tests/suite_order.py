"""The order in which the suite's processes take its modules (pytest hooks, used by
``tests/conftest.py``)."""

from __future__ import annotations

# The modules that take longest (minutes, mostly Ray Train and Tune starting their processes), in
# that order (their sums in two clean clones' `--durations=0` runs, 2026-11-28); the suite runs
# modules in parallel processes (pytest-xdist, one module to a process), and handing these out first
# lets the processes finish together.
SLOWEST_FIRST = ["test_multinode", "test_grid", "test_interrupts", "test_cluster_join", "test_recipe_cli",
                 "test_cluster_aws", "test_sweep_in_mlflow", "test_tracking_outage", "test_seeds", "test_cluster_job",
                 "test_reliability", "test_san_cli", "test_augcse_cli", "test_report", "test_cluster_lost",
                 "test_registry", "test_shim", "test_cli", "test_una_cli", "test_ray_address", "test_postgres",
                 "test_shuffle", "test_san", "test_paraphrase", "test_transfer", "test_loop", "test_losses"]


def pytest_configure(config):
    # pytest-xdist >= 3.6 re-sorts --dist loadfile's modules by their number of tests unless told
    # not to, which put the list above last (test_multinode began 12 minutes into a clean clone's
    # run, 2026-11-28): keep the order pytest_collection_modifyitems gives.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(items):
    rank = {name: i for i, name in enumerate(SLOWEST_FIRST)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))  # stable: in-module order kept
