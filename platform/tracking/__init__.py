"""MLflow, split by concern: ``names`` (every metric and tag name), ``store`` (where runs go, the
client, look-ups), ``recorder`` (the run record: a run's life, created, logged to and ended with a
status that says what happened, and every point that reaches it), ``model_registry`` (the Model
Registry and its ``champion`` alias) and ``hub`` (``--push-to-hub``)."""
