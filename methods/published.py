"""The papers' published STS results (Spearman x100, SentEval's "all" setting), by recipe and
backbone: what a reproduction is checked against (``platform.report``), and with ``NAMED`` what the
README's methods table is made from (``python -m methods.published`` prints it; ``tests/test_docs.py``
holds the README to it)."""

from __future__ import annotations

from typing import NamedTuple

from methods.recipe import NAMED, Recipe

# The 7 tasks' short names and their average, in the papers' order.
TASK_COLUMNS = ["STS12", "STS13", "STS14", "STS15", "STS16", "STS-B", "SICK-R", "Avg."]

# Published STS results (Spearman x100, SentEval "all" setting), by method and backbone. Per-task
# numbers where the paper's table gives them, the average otherwise. ``best_of``: the paper's number is the
# best of that many seeds (else a single run), which a row is compared with as such; ``variant``: a
# row of a non-default option of the recipe; ``sd``, ``n_seeds``: a mean ± sd over that many seeds. No
# row has those yet: PromptBERT's README gives "± 0.15" without the number of seeds, so it is checked
# as one run (a mean varies less than one run: that check errs towards "inside").
_SIMCSE_BERT = [68.40, 82.41, 74.38, 80.91, 78.56, 76.85, 72.23, 76.25]
_SIMCSE_ROBERTA = [70.16, 81.77, 73.24, 81.36, 80.65, 80.22, 68.56, 76.57]


class Published(NamedTuple):
    recipe: str
    backbone: str
    label: str
    scores: dict
    best_of: int = 0  # the paper's number is the best of this many seeds; 0: one run
    variant: str = ""
    sd: float = 0.0  # with n_seeds: the paper's number is a mean ± sd over n_seeds seeds (checked by Welch's test)
    n_seeds: int = 0


PUBLISHED = [Published(*row) for row in [
    ("simcse", "bert-base-uncased", "SimCSE (Gao et al., 2021, Table 5)", dict(zip(TASK_COLUMNS, _SIMCSE_BERT))),
    ("simcse", "roberta-base", "SimCSE (Gao et al., 2021, Table 5)", dict(zip(TASK_COLUMNS, _SIMCSE_ROBERTA))),
    ("una", "bert-base-uncased", "UNA (Shu et al.; their SimCSE: 75.32)", {"Avg.": 76.14}),
    ("una", "bert-base-uncased", "UNA + paraphrase positives (Shu et al.)", {"Avg.": 77.67}, 0, "with paraphrases"),
    ("una", "roberta-base", "UNA (Shu et al.; their SimCSE: 76.49)", {"Avg.": 76.74}),
    ("una", "roberta-base", "UNA + paraphrase positives (Shu et al.)", {"Avg.": 78.20}, 0, "with paraphrases"),
    ("san", "bert-base-uncased", "SimCSE + SAN (Cai et al.; their SimCSE: 76.64)", {"Avg.": 77.05}),
    ("san", "roberta-base", "SimCSE + SAN (Cai et al.; their SimCSE: 76.69)", {"Avg.": 76.94}),
    ("augcse", "bert-base-uncased", "AugCSE (Tang et al., 2022, Table 4; the best of 5 seeds, App. A.6)",
     dict(zip(TASK_COLUMNS, [71.40, 83.93, 75.59, 83.59, 79.61, 79.61, 72.19, 77.98])), 5),
    ("augcse", "roberta-base", "AugCSE (Tang et al., 2022, Table 4)",
     dict(zip(TASK_COLUMNS, [69.30, 82.17, 73.49, 81.82, 81.40, 80.86, 68.77, 76.83]))),
    ("vascl", "roberta-base", "VaSCL (Zhang et al., 2021; their SimCSE: 76.34)", {"Avg.": 76.96}),
    ("promptbert", "bert-base-uncased", "PromptBERT (Jiang et al., 2022; the authors' README, mean of seeds +- 0.15; selected on denoised "
     "dev, tested with evaluation.py's text)",
     {"Avg.": 78.54}),
    ("promptbert", "roberta-base", "PromptBERT (Jiang et al., 2022; the authors' README, mean of seeds +- 0.25; selected on denoised "
     "dev, tested with evaluation.py's text)",
     {"Avg.": 79.15}),
    ("sncse", "bert-base-uncased", "SNCSE (Wang et al., 2022, abstract; tested as *_prediction.py)", {"Avg.": 78.97}),
    ("sncse", "roberta-base", "SNCSE (Wang et al., 2022, abstract; tested as *_prediction.py)", {"Avg.": 79.23}),
    ("cotbert", "bert-base-uncased", "CoT-BERT (Zhang et al., 2023; the authors' ReadMe; 2 x 128 replicas, "
     "tested with evaluation.py's text)", {"Avg.": 79.40}),
    ("esimcse", "bert-base-uncased", "ESimCSE (Wu et al., 2022; the authors' log of their released model)",
     dict(zip(TASK_COLUMNS, [73.40, 83.27, 77.25, 82.66, 78.81, 80.17, 72.30, 78.27]))),
    ("esimcse", "roberta-base", "ESimCSE (Wu et al., 2022; the authors' log of their released model)",
     dict(zip(TASK_COLUMNS, [69.90, 82.50, 74.68, 83.19, 80.30, 80.99, 70.54, 77.44]))),
    ("cotbert", "roberta-base", "CoT-BERT (Zhang et al., 2023; the authors' ReadMe; 2 x 128 replicas, "
     "tested with evaluation.py's text)", {"Avg.": 80.62}),
]]


BEST_OF = {(p.recipe, p.backbone): p.best_of for p in PUBLISHED if p.best_of}
BACKBONES = ("bert-base-uncased", "roberta-base")  # the papers' two, the README's published column


def methods_table() -> str:
    """The README's methods table: each named recipe (``methods.recipe.NAMED``) with its published
    7-task averages (``PUBLISHED``) on the papers' two backbones. ``test_docs`` holds the README to it."""
    def avg(recipe: str, variant: str = "") -> str:
        cells = []
        for model in BACKBONES:
            found = [p for p in PUBLISHED if (p.recipe, p.backbone, p.variant) == (recipe, model, variant)]
            cells.append(f"{found[0].scores['Avg.']:.2f}" + (f" (best of {found[0].best_of} seeds)" if found[0].best_of
                                                             else "") if found else "—")
        return " / ".join(cells)

    rows = ["| Recipe | Paper | Supervision | What it adds to SimCSE | Published STS avg. (BERT-base / RoBERTa-base) | "
            "Keys that matter |", "|---|---|---|---|---|---|"]
    for name, named in NAMED.items():
        variants = sorted({p.variant for p in PUBLISHED if p.recipe == name} - {""})
        published = avg(name) + "".join(f" ({avg(name, v)} {v})" for v in variants)
        rows.append(f"| `{name}` | {named.authors} | {Recipe.named(name).supervision} | {named.adds} | {published} | "
                    f"{', '.join(f'`{k}`' for k in named.keys)} |")
    return "\n".join(rows)


if __name__ == "__main__":
    print(methods_table())
