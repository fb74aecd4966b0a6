"""The sweep's plots read right: a tick label on every panel (a log range inside one decade too),
trials of different budgets told apart, the importance plot with its n and the same bars for the
same trials."""

import pandas as pd
import pytest

from platform.space import SearchSpace
from platform.sweep_summary import importance_figure, params_figure, plots

SPACE = SearchSpace(space={"lr": ("loguniform", [1.0e-5, 8.0e-5]), "alpha": ("uniform", [0.0, 1.0]),
                           "pooler": ("choice", ["cls", "avg"])}, seed=3)


def _frame() -> pd.DataFrame:
    rows = [  # two trials at the full 24 steps, three that ASHA stopped at 8 or 16
        ("t1", 2.0e-5, 0.10, "cls", 71.0, 24, "FINISHED"), ("t2", 6.0e-5, 0.80, "avg", 74.5, 24, "FINISHED"),
        ("t3", 1.2e-5, 0.45, "avg", 60.2, 8, "FINISHED (stopped early)"), ("t4", 3.0e-5, 0.30, "cls", 63.9, 16, "FINISHED (stopped early)"),
        ("t5", 7.5e-5, 0.95, "cls", 58.0, 8, "FINISHED (stopped early)"),
        # five more at the full budget: fANOVA is shown from 10 trials on
        ("t6", 1.5e-5, 0.20, "avg", 69.0, 24, "FINISHED"), ("t7", 4.0e-5, 0.55, "cls", 72.3, 24, "FINISHED"),
        ("t8", 5.0e-5, 0.65, "avg", 73.1, 24, "FINISHED"), ("t9", 2.5e-5, 0.05, "cls", 70.2, 24, "FINISHED"),
        ("t10", 7.0e-5, 0.90, "avg", 74.0, 24, "FINISHED")]
    return pd.DataFrame(rows, columns=["trial_id", "lr", "alpha", "pooler", "best_stsb_dev_spearman", "steps", "status"])


def _tick_labels(ax) -> list[str]:
    return [t.get_text() for t in ax.get_xticklabels() if t.get_text() and ax.get_xlim()[0] <= t.get_position()[0] <= ax.get_xlim()[1]]


def test_every_panel_has_tick_labels_and_budgets_are_told_apart():
    fig = params_figure(_frame(), SPACE)
    fig.canvas.draw()
    panels = [ax for ax in fig.axes if ax.get_visible()]
    assert [ax.get_xlabel() for ax in panels] == ["lr", "alpha", "pooler"]
    for ax in panels:
        assert len(_tick_labels(ax)) >= 2, (ax.get_xlabel(), _tick_labels(ax))
    assert _tick_labels(panels[2]) == ["cls", "avg"]
    legend = [t.get_text() for t in fig.legends[0].get_texts()]
    assert legend == ["24 steps", "16 steps", "8 steps", "finished", "finished (stopped early)"]
    # One colour per budget in every panel: the 8-step trials share one, apart from the 24-step ones.
    colours = {}
    for collection in panels[0].collections:
        (colour,) = {tuple(c) for c in collection.get_edgecolors()} | {tuple(c) for c in collection.get_facecolors()}
        for _, y in collection.get_offsets():
            colours[round(float(y), 1)] = colour
    assert colours[60.2] == colours[58.0] != colours[71.0] == colours[74.5] != colours[63.9]


def test_the_importance_plot_says_its_n_and_is_a_function_of_the_trials():
    def bars(fig):
        (ax,) = fig.axes
        return ax.get_title(), sorted((t.get_text(), round(p.get_width(), 9))
                                      for t, p in zip(ax.get_yticklabels(), ax.patches))

    title, first = bars(importance_figure(_frame(), SPACE))
    assert "n = 10 trials (7 at 24 steps, 1 at 16 steps, 2 at 8 steps)" in title
    assert {name for name, _ in first} == {"lr", "alpha", "pooler"}
    assert sum(w for _, w in first) == pytest.approx(1.0, abs=0.02)  # Optuna's bars are rounded to 2 digits
    assert bars(importance_figure(_frame(), SPACE))[1] == first
    assert importance_figure(_frame().head(9), SPACE) is None  # too few trials for fANOVA to mean something
    assert ax_legend_free(importance_figure(_frame(), SPACE))


def ax_legend_free(fig) -> bool:
    return all(ax.get_legend() is None for ax in fig.axes)


def test_the_parameters_are_a_grid_of_at_most_two_columns():
    """Readable in MLflow's preview pane: rows of two panels, not a strip."""
    fig = params_figure(_frame(), SPACE)
    panels = [ax for ax in fig.axes if ax.get_visible()]
    columns = {round(ax.get_position().x0, 2) for ax in panels}
    assert len(columns) == 2 and fig.get_size_inches()[0] / fig.get_size_inches()[1] < 2


def test_plots_are_written_as_png(tmp_path):
    from PIL import Image

    paths = plots(_frame(), SPACE, tmp_path)
    assert [p.name for p in paths] == ["params_vs_stsb_dev_spearman.png", "param_importance.png"]
    for path in paths:
        with Image.open(path) as image:
            assert image.format == "PNG" and image.size[0] >= 500
