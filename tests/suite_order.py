"""The order in which the suite's processes take its modules (pytest hooks, used by
``tests/conftest.py``)."""

from __future__ import annotations

# The modules that take longest (minutes, mostly Ray Train and Tune starting their processes), in
# that order, for the suite (the README's test command) and for the scenarios (``-m scenario``),
# from their sums in a clean clone's `--durations=0` run of each; each runs its modules
# in parallel processes (pytest-xdist, one module to a process), and handing these out first lets
# the processes finish together. Modules with tests in both are placed by their share in each.
SLOWEST_FIRST = ["test_sweep_in_mlflow", "test_seeds", "test_cluster_aws", "test_san_cli", "test_report",
                 "test_postgres", "test_registry", "test_transfer", "test_paraphrase", "test_recipe_cli", "test_shim",
                 "test_cli", "test_una_cli", "test_san", "test_shuffle", "test_lifecycle", "test_loop",
                 "test_static_step", "test_architecture", "test_interrupts", "test_losses", "test_bad_input"]
SCENARIOS_SLOWEST_FIRST = ["test_cluster_boot", "test_cluster_slurm", "test_benchmarks", "test_multinode", "test_grid", "test_interrupts", "test_cluster_join", "test_recipe_cli",
                           "test_prompt_cli", "test_tracking_outage", "test_cluster_job", "test_cluster_aws", "test_reliability",
                           "test_cluster_lost", "test_ray_address"]


def pytest_configure(config):
    # pytest-xdist >= 3.6 re-sorts --dist loadfile's modules by their number of tests unless told
    # not to, which put the list above last (test_multinode began 12 minutes into a clean clone's
    # run): keep the order pytest_collection_modifyitems gives.
    if hasattr(config.option, "loadscopereorder"):
        config.option.loadscopereorder = False


def pytest_collection_modifyitems(config, items):
    order = SCENARIOS_SLOWEST_FIRST if config.getoption("markexpr", "") == "scenario" else SLOWEST_FIRST
    rank = {name: i for i, name in enumerate(order)}
    items.sort(key=lambda item: rank.get(item.module.__name__.rsplit(".", 1)[-1], len(rank)))  # stable: in-module order kept
