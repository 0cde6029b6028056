"""report.md, and write_report: the whole report folder (results.json, the charts, report.md) for a result.

report.md puts the claim, the evidence and the environment together: the machine and its measured peak, the
table, how repeatable its verdicts are, how to read it, the metric's noise band, notes, the doctor's findings when
`trainfast doctor --out` wrote them to the same folder, the recommendation and the charts."""
from __future__ import annotations

import json
from pathlib import Path

from ..checkpoint import atomic_write_text
from ..checks import INPUT_BOUND_SHARE
from ..results import AblationResult, Rung, Status
from .charts import write_charts
from .doctor_findings import doctor_section
from .format import roofs_text, rung_label
from .memory import memory_section
from .ranks import ranks_section
from .world import world_section
from .target import target_section, write_target_chart
from .notes import rung_notes
from .progress import time_line
from .results_json import write_results_json
from .summary import best_line, judged_line, keep_line, machine_line, repeatability_line
from .table import Columns, headers, judged_name, markdown_table, table_rows

RECOMMENDATION_RULE = (
    "Candidates are the baseline and the measured rungs whose judged metric is not outside the baseline's noise "
    "band on the wrong side (below it for a metric to maximize, above it for a loss; risky O3 rungs are measured, "
    "never recommended). A rung is recommended over a simpler one only "
    "when it is measurably faster than it, with a firm verdict (a `?` verdict, one a rerun would not "
    "repeat at least 80% of the time, is within the noise and never changes the recommendation): the "
    "fastest rung, when it is measurably faster than the baseline, or the simplest of the rungs that are "
    "measurably faster than the baseline and not measurably slower than it. The rungs not measurably "
    "different from the recommendation are its tie (`best.tie` in results.json). How often a rerun would "
    "recommend each rung (`best.rerun_odds`): 400 simulated reruns, each rung's mean drawn around this "
    "run's with this run's error and the rerun's own (the pooled noise), the same rule applied.")


def write_report(result: AblationResult) -> None:
    """The report folder: results.json, the charts and report.md."""
    write_results_json(result)
    charts = write_charts(result)
    curves = write_target_chart(result)            # --target: each rung's metric against its training time
    charts += [curves] if curves is not None else []
    atomic_write_text(Path(result.out_dir) / "report.md", "\n".join(report_lines(result, charts)))


def report_lines(result: AblationResult, charts: list[Path]) -> list[str]:
    env = result.environment
    columns = Columns.for_settings(result.settings, result.rungs, result.metric)
    repeatability = repeatability_line(result)
    lines = [
        "# trainfast ablation report", "",
        f"Measured on **{env['device_name']}** ({env['device']}, {env['cpu_cores']} cores, torch {env['torch']}, "
        f"git {env['git_sha'] or 'n/a'}). CPU flags: {', '.join(env['cpu_flags']) or 'none of note'}.", "",
        "Measured matmul peak (the roof for `% of matmul peak`): "
        + roofs_text(result.ceilings, result.settings) + ".", "",
        markdown_table(headers(columns), table_rows(result.rungs, columns)), "",
        data_wait_line(result.rungs), "",
        *([rate, ""] if (rate := documents_line(result)) else []),
        *([repeatability, ""] if repeatability else []),
        *([machine, ""] if (machine := machine_line(result)) else []),
        *([took, ""] if (took := time_line(result.settings)) else []),
        how_to_read(result), "",
    ]
    if result.rungs[0].result.metric is not None:
        lines += [metric_note(result), ""]
    lines += target_section(result, charts)     # --target: time to target, its factors, its verdict
    items = rung_notes(result)
    if items:
        lines += ["## Notes", "", *items, ""]
    lines += memory_section(result)             # each rung's profiled step by what holds the memory
    lines += ranks_section(result)              # several ranks: each one's own figures and the straggler
    lines += world_section(result)              # --nproc 1,2: each size's rates, efficiency, time to target
    lines += doctor_section(result.out_dir)      # `trainfast doctor --out` this folder: its findings, when present
    keep = keep_line(result.settings, result.best)
    lines += ["## Recommendation", "", best_line(result) + ".", ""]
    lines += [keep[0].upper() + keep[1:] + ".", ""] if keep else []
    lines += [RECOMMENDATION_RULE, ""]
    if result.best is not None and not result.settings.get("no_session"):   # a script no recipe reaches: no file
        lines += ["```json", json.dumps(result.best.to_dict(), indent=2), "```", ""]
    return lines + ["## Charts", ""] + [f"![{c.stem}]({c.name})" for c in charts if c.stem != "target_curves"] + [""]


def how_to_read(result: AblationResult) -> str:
    st = result.settings
    budget = st.get("budget", {})
    if st.get("whole_run"):
        timed = ("Each run is timed whole: every step after its warm-up (found on each step's seconds per token) to "
                 "the end of the run, the same documents in every rung. tokens/s is the tokens the loss predicts "
                 "over the total time of those steps (what a clock around them reads)")
    else:
        timed = ("Each run is timed over its steady steps: warm-up (compilation, allocator, worker start-up) ends "
                 "where step times settle, detected per run, and the data is cycled past the epoch until at least "
                 f"{budget.get('steps')} steady steps (or {budget.get('floor')} once they take "
                 f"{budget.get('seconds'):g} s) are timed. samples/s is total samples over total time of those "
                 "steps (what a clock around them reads)")
    return (
        f"How to read it: every rung ran {st.get('repeats')} time(s), each in a fresh process, in interleaved order "
        "(every rung once, then every rung again; repeat i with seed + i in every rung), so a slow spell of the "
        f"machine hits all rungs alike. {timed}, the mean over repeats, ± the half-width of its 95% interval. "
        "The speed-up is "
        "the geometric mean over paired repeats of rate(rung) / rate(reference); its 95% interval is a paired "
        "t-interval with the process-to-process noise pooled over every rung (log rate = rung + pass + noise; "
        "with one repeat, a block bootstrap over the steps of that process instead). A rung is `faster` or `slower` "
        f"only when that interval excludes 1.0, the effect is at least {100 * st.get('min_effect', 0):.0f}%, and "
        "(with repeats) the estimate clears that line by the margin that makes a rerun of the same command call "
        "it too at least 80% of the time; otherwise `no measurable difference`, so that two runs agree. "
        "`vs rung above` judges what adding this rung's switch bought. "
        "`step alone` is the rung's own step replayed on one batch kept on the device (no loader, no copy, no "
        "wait; warm-up left out): what the switch does to the arithmetic, with its speed-up over the baseline's "
        "step alone, and the share of it the timed epoch reached (well under 100%: the input holds the epoch). "
        "Epoch s is the mean wall time of the accuracy run's epochs, warm-up included (evaluation excluded). "
        "Peak memory is the CUDA allocator peak on GPU, the rung process's peak RSS on CPU (the largest over "
        "repeats; the Memory section, where a Session's step was profiled, says what holds it). `% of matmul "
        "peak` is the model's FLOP/s (torch.utils.flop_counter) over the best matmul "
        "FLOP/s measured in the rung's dtype on this machine before and after the ladder: a measured peak, "
        "not the hardware's limit.")


def documents_line(result: AblationResult) -> str | None:
    """A language model's rates in documents/s beside its tokens/s (real tokens only, padding never counted)."""
    per = result.settings.get("tokens_per_sample")
    if not per:
        return None
    rates = [f"{rung_label(r)} {r.result.throughput / per:,.1f}" for r in result.rungs if r.result.throughput]
    return (f"tokens/s counts the real tokens only, never padding; a training document averages {per:.1f} tokens, so "
            "in documents/s: " + (", ".join(rates) or "—") + ".")


def data_wait_line(rungs: list[Rung]) -> str:
    """Input-bound or not, for every measured rung: the share of the timed steps the loop spent waiting for
    the next batch (the rest is computing). Above checks.INPUT_BOUND_SHARE, faster input would speed the run up."""
    done = [r for r in rungs if r.status == Status.DONE and r.result.data_wait_fraction is not None]
    parts = [f"{rung_label(r)} {100 * r.result.data_wait_fraction:.0f}%"
             + (f" + copy {100 * r.result.copy_fraction:.0f}%" if r.result.copy_fraction is not None else "")
             + (" (input-bound)" if r.result.data_wait_fraction > INPUT_BOUND_SHARE else "")
             for r in done]
    if not parts and any(r.status == Status.DONE for r in rungs):
        return ("Time waiting for data: not measured (the script feeds its own loader: only a trainfast.Session "
                "times the wait for each batch).")
    if any(r.result.copy_fraction is not None for r in done):
        return ("Time waiting for data, on the device's timeline (share of the timed steps the GPU sat idle for lack "
                "of a batch; then, apart, the share it spent copying and preparing batches on the compute stream; "
                "the rest is the step's own work): " + ", ".join(parts) + ".")
    return "Time waiting for data (share of the timed steps; the rest is computing): " + (", ".join(parts) or "—") + "."


def metric_note(result: AblationResult) -> str:
    """The judged metric's noise band, how it was made, and the rungs outside it (or that there is none)."""
    if (result.settings.get("target") or {}).get("value") is not None:
        return ("With --target each run stopped at its first evaluation that reached the target (the baseline trained "
                "half as long again past its planned end): the metric column is where each run stopped, not one "
                "step, and no rung is judged on it; the time to target below judges them.")
    base = result.rungs[0].result
    band = next((r.result.metric_band for r in result.rungs if r.result.metric_band is not None), None)
    flagged = [rung_label(r) for r in result.rungs if r.result.metric_flag]
    values = [s["metric"] for s in result.seed_runs if s.get("metric") is not None]
    seeds = ", ".join(f"{v:.3f}" for v in values)
    runs = result.settings.get("repeats", 1)
    outside = ("Outside it (marked !): " + ", ".join(flagged) + ".") if flagged else "Every rung is inside it."
    if band is None:        # one baseline run finished (a seed failed or --noise-seeds 1): nothing to judge against
        name = Columns.for_settings(result.settings, result.rungs, result.metric).metric_label
        return (f"{name}: no noise band (one baseline run); give the baseline more seeds with --noise-seeds "
                "to judge the metric.")
    if base.val_samples is None:         # a script's own metric: seed-to-seed noise only
        name = Columns.for_settings(result.settings, result.rungs, result.metric).metric_label
        judged = judged_line(result)
        text = (f"{judged}. " if judged else "") + (f"{name} noise band: ±{band:.3g} around the baseline's mean over "
                f"{len(values)} seed(s) ({seeds}): two seed-to-seed standard deviations, scaled for comparing a rung's "
                f"mean over its {runs} seed(s) with that mean. Δ is measured from that mean. ")
        if band == 0:
            text += ("The seeds all gave the same value: if the script seeds its own random generators after "
                     "creating the Session, the ablation's seeds do not reach it and any change is flagged. ")
        return text + outside
    name = judged_name(result)     # accuracy, detection's mAP
    title = name if name[1:2].isupper() else name[0].upper() + name[1:]       # "mAP" stays "mAP"
    proxy = "" if name == "accuracy" else (f" (for {name}, those of a proportion of that size: a proxy, as {name} "
                                           "is not a share of images)")
    return (f"{title} noise band: ±{band:.3f} around the baseline's mean {name} over {len(values)} "
            f"seed(s) ({seeds}) on {base.val_samples} held-out samples: the larger of two binomial standard errors "
            f"of a difference{proxy} and two seed-to-seed standard deviations (scaled for comparing a rung's mean over "
            f"its {runs} seed(s) with that mean). Δ is measured from that mean. " + outside)
