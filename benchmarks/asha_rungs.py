"""How well ASHA's rungs judge a sweep (issue 33, item 6): over a sweep's trials that ran to their
last evaluation, the rank correlation (Spearman) between each trial's best STS-B dev at a rung
and its final best, rung by rung, and whether the rung's leader is the final winner.

A rung at ``grace_period * reduction_factor**k`` evaluations is where ASHA keeps the top
``1/reduction_factor`` of the trials that reached it; a correlation near 1 there means stopping
at that rung loses little. Run the sweep with ``scheduler: {type: none}`` (every trial to its end)
to measure, then read it::

    MLFLOW_TRACKING_URI=... python benchmarks/asha_rungs.py --experiment simcse [--sweep RUN_ID]
        [--grace 16] [--reduction-factor 2]
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from platform.sweep_summary import rung_table  # noqa: E402

DEV = "stsb_dev_spearman"


def main() -> None:
    from mlflow.tracking import MlflowClient

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--experiment", required=True)
    p.add_argument("--sweep", default=None, help="the sweep's parent run id (default: the newest sweep)")
    p.add_argument("--grace", type=int, default=1, help="the first rung, in evaluations")
    p.add_argument("--reduction-factor", type=float, default=2.0)
    args = p.parse_args()

    client = MlflowClient()
    experiment = client.get_experiment_by_name(args.experiment)
    if experiment is None:
        raise SystemExit(f"error: no experiment {args.experiment!r}")
    ids = [experiment.experiment_id]
    sweep = args.sweep or client.search_runs(ids, "tags.sweep = 'true'", order_by=["attributes.start_time DESC"],
                                             max_results=1)[0].info.run_id
    trials = client.search_runs(ids, f"tags.`mlflow.parentRunId` = '{sweep}' and attributes.status = 'FINISHED'")
    histories = {}
    for run in trials:
        if run.data.tags.get("stopped_by_scheduler") == "true":
            continue  # no final score to compare with
        points = sorted(client.get_metric_history(run.info.run_id, DEV), key=lambda m: m.step)
        histories[run.data.tags.get("trial_id", run.info.run_id)] = [m.value for m in points]
    if len(histories) < 3:
        raise SystemExit(f"error: sweep {sweep} has {len(histories)} trials run to their end; 3 or more are needed")
    print(f"sweep {sweep}: {len(histories)} trials run to the end, {min(map(len, histories.values()))} evaluations each")
    print(f"{'rung (evaluations)':>18} | {'trials':>6} | {'Spearman vs final best':>22} | leader wins")
    for rung, n, rho, leads in rung_table(histories, args.grace, args.reduction_factor):
        print(f"{rung:>18} | {n:>6} | {rho:>22.2f} | {'yes' if leads else 'no'}")


if __name__ == "__main__":
    main()
