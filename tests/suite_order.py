"""The order in which the suite's processes take its modules (pytest hooks, used by
``tests/conftest.py``)."""

from __future__ import annotations

# The modules that take longest (minutes, mostly Ray Train and Tune starting their processes), in
# that order, for the suite (the README's test command) and for the scenarios (``-m scenario``),
# from their sums in a clean clone's `--durations=0` run of each; each runs its modules
# in parallel processes (pytest-xdist, one module to a process), and handing these out first lets
# the processes finish together. Modules with tests in both are placed by their share in each.
SLOWEST_FIRST = ["test_cluster_aws", "test_sweep_in_mlflow", "test_seeds", "test_benchmark_records",
                 "test_esimcse_cli", "test_slurm_script", "test_cli", "test_slurm_sizing", "test_matryoshka_cli",
                 "test_recipe_cli", "test_san_cli", "test_report", "test_postgres", "test_shim", "test_registry",
                 "test_prompt_evaluation", "test_transfer", "test_sweep_stall", "test_una_cli", "test_teachers",
                 "test_architecture", "test_loop", "test_san", "test_paraphrase", "test_calibration", "test_mteb",
                 "test_cluster_config", "test_shuffle"]
SCENARIOS_SLOWEST_FIRST = ["test_cluster_boot", "test_cluster_slurm", "test_benchmarks", "test_sweep_slow_tracking",
                           "test_prompt_cli", "test_multinode", "test_interrupts", "test_grid", "test_cluster_join",
                           "test_recipe_cli", "test_quiet_stop", "test_tracking_outage", "test_cluster_job", "test_cluster_lost",
                           "test_reliability", "test_cluster_aws", "test_compare", "test_ray_address",
                           "test_prompt_checkpoints"]


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
