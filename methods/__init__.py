"""The science: encoders, augmentations and losses in plain PyTorch and text processing.

Nothing here imports Ray or MLflow, so every method runs on a machine that has neither.
"""

from methods.base import REGISTRY, InvalidParams, Method, MethodParams, method_class

__all__ = ["REGISTRY", "InvalidParams", "Method", "MethodParams", "method_class"]
