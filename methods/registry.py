"""Every ingredient a recipe can name, registered in one place: one line each, ``"module:Class"``.

The class says what it is: its kind (the interface it subclasses: ``Positives``,
``NegativesSource``, ``Loss``, ``AuxTerm``), its ``name`` (what ``--set negatives=...`` takes), its
``Params`` (the paper's defaults), the paper it ``cites`` and the search ``space`` its parameters
come from. ``docs/recipes.md`` shows adding one.
"""

from __future__ import annotations

import re

from methods.ingredients import KINDS, AuxTerm, EncoderIngredient, Ingredient, NegativesSource, Positives, import_by_name
from methods.losses import Loss

REGISTERED = (
    "methods.plain:PlainEncoder",
    "methods.prompt:PromptEncoder",
    "methods.positives:DropoutPositives",
    "methods.positives:ParaphrasePositives",
    "methods.esimcse:RepetitionPositives",
    "methods.una:UNA",
    "methods.san:SAN",
    "methods.cotbert:TemplateNegatives",
    "methods.esimcse:MomentumQueue",
    "methods.mined:MinedNegatives",
    "methods.losses:InfoNCE",
    "methods.losses:HiNCE",
    "methods.losses:NTXent",
    "methods.losses:SymmetricInfoNCE",
    "methods.cotbert:CoTLoss",
    "methods.vascl:VaSCL",
    "methods.augcse:AugCSE",
    "methods.sncse:BML",
    "methods.rankcse:RankDistillation",
)

INTERFACES: dict[str, type[Ingredient]] = {"encoder": EncoderIngredient, "positives": Positives, "negatives": NegativesSource, "loss": Loss,
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


FIELDS = ("Inputs", "Requires", "Paper", "Example")


def described(cls: type[Ingredient]) -> dict[str, str]:
    """An ingredient's docstring in its fields: what it adds (the first paragraph), ``Inputs``,
    ``Requires`` (with what it combines with), ``Paper`` and ``Example`` (its ``--set`` line)."""
    paragraphs = [" ".join(p.split()) for p in (cls.__doc__ or "").split("\n\n") if p.strip()]
    out = {"adds": re.sub(r"^``\w+=\w+``: ", "", paragraphs[0]) if paragraphs else ""}
    for line in (cls.__doc__ or "").splitlines():
        key, _, value = line.strip().partition(": ")
        if key in FIELDS:
            out[key] = value
    return out


def ingredient_table() -> str:
    """docs/recipes.md's ingredient table, from the registered ingredients' docstrings."""
    rows = ["| kind | name | what it adds | inputs | requires; combines with | paper | example |",
            "|---|---|---|---|---|---|---|"]
    for kind, found in INGREDIENTS.items():
        for name, cls in found.items():
            d = described(cls)
            rows.append(f"| {kind} | `{name}` | {d['adds']} | {d.get('Inputs', '')} | {d.get('Requires', '')} | "
                        f"{d.get('Paper', '')} | `{d.get('Example', '')}` |".replace("``", "`"))
    return "\n".join(rows)


if __name__ == "__main__":
    print(ingredient_table())
