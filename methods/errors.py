"""The errors ``methods/`` raises for bad input: a hyperparameter or a combination of ingredients,
a backbone that cannot be found, weights that do not fit. Plain exceptions in a module that imports
nothing, so ``platform.errors`` can treat them as user errors without importing torch (every Ray
process that loads the platform's error root, Ray Train's controller among them, would pay for it)."""


class InvalidParams(ValueError):
    """A hyperparameter, or a combination of ingredients, is invalid; the message says which."""


class WeightLoadError(RuntimeError):
    """The checkpoint's weights do not match the model architecture."""


class BackboneNotFound(FileNotFoundError):
    """Neither a local directory nor a model name that can be resolved offline."""
