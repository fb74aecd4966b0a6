"""The benchmark suite: named cases, one harness, a JSON record per run (``python -m benchmarks``)."""
