"""Every ingredient a recipe can name, registered in one place: one line each, ``"module:Class"``.

The class says what it is: its kind (the interface it subclasses: ``Positives``,
``NegativesSource``, ``Loss``, ``AuxTerm``), its ``name`` (what ``--set negatives=...`` takes), its
``Params`` (the paper's defaults), the paper it ``cites`` and the search ``space`` its parameters
come from. ``docs/recipes.md`` shows adding one.
"""

from __future__ import annotations

from methods.ingredients import KINDS, AuxTerm, Ingredient, NegativesSource, Positives, import_by_name
from methods.losses import Loss

REGISTERED = (
    "methods.positives:DropoutPositives",
    "methods.positives:ParaphrasePositives",
    "methods.una:UNA",
    "methods.san:SAN",
    "methods.losses:InfoNCE",
    "methods.losses:HiNCE",
    "methods.losses:NTXent",
    "methods.losses:SymmetricInfoNCE",
    "methods.vascl:VaSCL",
    "methods.augcse:AugCSE",
)

INTERFACES: dict[str, type[Ingredient]] = {"positives": Positives, "negatives": NegativesSource, "loss": Loss,
                                           "aux": AuxTerm}


def load(entries: tuple[str, ...]) -> dict[str, dict[str, type[Ingredient]]]:
    """``{kind: {name: class}}`` of the registered ingredients, each checked against its kind."""
    out: dict[str, dict[str, type[Ingredient]]] = {kind: {} for kind in KINDS}
    for entry in entries:
        cls = import_by_name(entry)
        interface = INTERFACES.get(getattr(cls, "kind", ""))
        if interface is None or not issubclass(cls, interface):
            raise TypeError(f"{entry}: an ingredient subclasses one of {', '.join(c.__name__ for c in INTERFACES.values())}")
        if not cls.name or cls.name in out[cls.kind]:
            raise TypeError(f"{entry}: its name {cls.name!r} is empty or already taken in {cls.kind}")
        out[cls.kind][cls.name] = cls
    return out


INGREDIENTS = load(REGISTERED)
