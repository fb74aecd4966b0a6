"""The science: encoders, augmentations, losses and the recipes that combine them, in plain PyTorch
and text processing (``methods.recipe`` is the entry point).

Nothing here imports Ray or MLflow, so every recipe runs on a machine that has neither.
"""
