"""One module per case, each defining ``CASE`` (``benchmarks.harness.Case``)."""
