"""MLflow, split by concern: ``store`` (where runs go, the client, look-ups), ``runs`` (a run's
life: created, logged to, ended with a status that says what happened) and ``registry`` (the
Model Registry and its ``champion`` alias)."""
