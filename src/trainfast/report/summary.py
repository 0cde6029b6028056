"""The sentences the terminal and report.md both end with: the recommendation, and how repeatable the
verdicts behind it are."""
from __future__ import annotations

import math
import shlex

from ..recipe import Recipe
from ..results import AblationResult, Rung, Status
from ..stats import FIRM, MIN_EFFECT
from ..techniques import process_env, process_wide_switches
from .format import repeats_advice, rung_label


def keep_line(settings: dict, best: Recipe | None) -> str | None:
    """For a script the recipe cannot reach (no Session, no framework adapter: `settings` of its ablation say
    so) whose recommended recipe `best` turns on a process-wide switch: how to keep it, the environment to start
    the script with (and, for a switch no variable carries, the line its declaration gives). None otherwise."""
    if not settings.get("no_session") or best is None:
        return None
    env = process_env(best)
    by_hand = [hooks.keep for name, hooks in process_wide_switches()
               if getattr(best, name, False) and not hooks.environ()]
    if not env and not by_hand:
        return None
    command = shlex.join(settings.get("command") or ["COMMAND"])
    text = "to keep it (the script takes no recipe: no trainfast.Session, no framework adapter)"
    if env:
        text += f", start the script with that environment: `{' '.join(f'{k}={v}' for k, v in env.items())} {command}`"
    return text + "".join(f"; {keep}" for keep in by_hand)


def best_line(result: AblationResult) -> str:
    """The recommendation, the rungs not measurably different from it, and how often a rerun would recommend
    the same (stats.recommendation_odds): an answer one run gives and the next may not is said to be one."""
    if result.no_recommendation:
        return f"no recommendation: {result.no_recommendation}"
    labels = {r.name: rung_label(r) for r in result.rungs}
    text = f"recommended: {labels[result.best_name]}"
    best = next((r for r in result.rungs if r.name == result.best_name and r.script), None)
    if best is not None:            # a rung of the script's own flags: the command line that runs it
        env = " ".join(f"{k}={shlex.quote(v)}" for k, v in best.script["command_env"].items())
        text += f" (run: `{env + ' ' if env else ''}{shlex.join(best.script['command'])}`)"
    missing = unreported_metric(result)
    judged = judged_line(result)
    if missing is not None:
        text += (f" (on speed alone: the script never reported {missing or 'a metric'}, so no rung's accuracy was "
                 f"checked; call tf.report({missing or 'val_accuracy'}=...) after its evaluation, or log its "
                 "validation loss or declare its metric through its framework)")
    elif judged:
        text += f" ({judged[0].lower() + judged[1:]})"
    target = result.settings.get("target")
    if target and target.get("value") is not None:
        summary = next((r.result.to_target for r in result.rungs if r.name == result.best_name), None) or {}
        text += (f", on its time to {target['text'].split(' (')[0]}: "
                 + ("no rung reached it measurably sooner than the baseline" if result.best_name == result.rungs[0].name
                    else f"{summary.get('speedup', 0):.2f}x sooner than the baseline"))
    others = [n for n in result.tie if n != result.best_name]
    if others:
        text += (f" (tied with {', '.join(labels[n] for n in others)}: not measurably different from it; of the "
                 "rungs not measurably slower than the fastest, the simplest is recommended, and a `?` verdict is "
                 "within the noise)")
    same = result.odds.get(result.best_name)
    if same is None:
        return text
    if same >= FIRM:
        return text + f". A rerun would recommend the same about {100 * same:.0f}% of the time"
    rest = ", ".join(f"{labels[n]} {100 * p:.0f}%" for n, p in result.odds.items()
                     if n != result.best_name and p >= 0.05)
    return (text + f". A rerun would recommend the same only about {100 * same:.0f}% of the time ({rest}): these "
            "rungs are within the noise of each other here, so which of them is recommended is not a finding; "
            "more --repeats separate them")


def unreported_metric(result: AblationResult) -> str | None:
    """`--measure full` on a script where no run reported the metric (nothing was compared): its name ("" when
    --metric was left to the script), else None."""
    settings = result.settings
    if settings.get("measure") != "full" or not settings.get("command"):
        return None
    if any(r.result.metric is not None for r in result.rungs if r.result is not None):
        return None
    return (settings.get("metric") or {}).get("name") or ""


def judged_line(result: AblationResult) -> str | None:
    """Which metric a script's rungs were judged on and why (ablation/metric.py), e.g. "judged on eval_accuracy:
    the script's metric_for_best_model='accuracy', greater_is_better=True, higher is better"; None for the
    built-in run, a speed-only ablation, or a metric that was not chosen."""
    metric = result.metric or {}
    if not result.settings.get("command") or result.settings.get("measure") != "full" or not metric.get("name"):
        return None
    return f"Judged on {metric['name']}: {metric.get('why') or 'as named'}"


def judged(result: AblationResult) -> list[Rung]:
    """The finished rungs judged against the baseline."""
    return [r for r in result.rungs if r.status == Status.DONE and r.name != "baseline"]


def own_noise_text(result: AblationResult, pooled: dict) -> str:
    """The rungs whose repeats disagreed far more than the others' (stats.split_noise), named with their spread:
    each is judged on its own, and the pool, and so every other rung's interval, leaves it out."""
    own = [(rung_label(r), r.result.noise["sigma_log"]) for r in result.rungs
           if r.status == Status.DONE and r.result.noise and r.result.noise.get("own")]
    if not own:
        return ""
    named = ", ".join(f"{name} ({100 * sigma:.1f}%)" for name, sigma in own)
    return (f"The repeats of {named} disagreed far more than the others' ({100 * pooled['sigma_log']:.1f}%): "
            f"{'each is' if len(own) > 1 else 'it is'} judged on its own spread, which the other rungs' intervals "
            "leave out. ")


def repeatability_line(result: AblationResult) -> str | None:
    """How repeatable these verdicts are, from the measured process-to-process noise: the smallest difference
    found in 80% of runs, the verdicts a rerun may not repeat (marked ?), and the repeats that would make 10%
    (or --min-effect, if larger) detectable. None without a pooled noise estimate (one repeat)."""
    noises = [r.result.noise for r in result.rungs if r.status == Status.DONE and r.result.noise]
    noise = next((n for n in noises if not n.get("own")), noises[0] if noises else None)
    if not noise:
        return None
    shaky = [rung_label(r) + ("" if r.result.is_firm else " (vs baseline)") for r in judged(result)
             if r.result.unsettled]
    (target, repeats), = noise["repeats_for"].items()
    if noise["detectable_effect"] >= 1.0:
        # A bound from too few degrees of freedom ("below ~851581%") means nothing: say so and what would do.
        return (f"Repeatability: too few repeats to judge. The runs moved {100 * noise['sigma_log']:.1f}% from one "
                f"to the next (pooled over the rungs, {noise['df']} df), and on so few degrees of freedom no "
                "interval bounds a difference usefully: the verdicts here are not measurements. Named runs that "
                "disagree with their twins are in the notes. " + settle_text(result)
                + f"For a {100 * float(target):.0f}% difference: {repeats_advice(repeats)}.")
    if noise.get("paired"):
        between = noise.get("process_sigma_log")
        text = (f"Repeatability: each run was also timed against the baseline in alternating blocks inside its own "
                f"process; the noise of those ratios is {100 * noise['sigma_log']:.1f}% per run (pooled over "
                f"the rungs, {noise['df']} df)" + (f", where the runs' own rates moved {100 * between:.1f}% from "
                                                   "process to process" if between is not None else "") +
                f"; with {result.settings.get('repeats')} repeats a speed-up below ")
    else:
        text = (f"Repeatability: the process-to-process noise is {100 * noise['sigma_log']:.1f}% per run (pooled over "
                f"the rungs, {noise['df']} df); with {result.settings.get('repeats')} repeats a speed-up below ")
    text += f"~{100 * noise['detectable_effect']:.0f}% between two rungs is found in fewer than 80% of runs. "
    text += own_noise_text(result, noise)
    text += settle_text(result)
    if shaky:
        text += (f"Verdicts marked ? ({', '.join(shaky)}) would be repeated by a rerun less than 80% of the time: "
                 "their differences sit near the decision threshold, within the noise, and another run may call "
                 "them otherwise. ")
    else:
        text += "Every verdict here would be repeated by a rerun at least 80% of the time. "
    together = joint_agreement(result)
    if together is not None:
        text += (f"All the verdicts against the baseline at once: a rerun would repeat every one of them about "
                 f"{100 * together:.0f}% of the time (the product of their chances, as if independent). ")
    return text + f"`--repeats {repeats}` would make a {100 * float(target):.0f}% difference detectable."


MACHINE_MOVED = 0.05   # a drift or jitter of the fixed workload below this is its own noise on a quiet 2-core VM


def machine_line(result: AblationResult) -> str | None:
    """The machine itself, apart from any rung: a fixed workload timed before the first run and after the last
    (procstate.reference_check). A drift or a jitter of the order of the runs' noise says the machine, not the
    switches, moved the numbers; None when it was not timed at both ends (an interrupted ladder)."""
    check = result.settings.get("machine_check") or {}
    start, end = check.get("start"), check.get("end")
    if not (start and end):
        return None
    drift = end["median_s"] / start["median_s"] - 1
    jitter = max(c["median_s"] / c["min_s"] - 1 for c in (start, end))     # a typical repeat against the best
    text = (f"The machine itself: a fixed workload (fp32 matmuls, {1000 * start['median_s']:.0f} ms) timed before the "
            f"first run and after the last took {abs(drift):.1%} {'longer' if drift >= 0 else 'less time'} at the "
            f"end; its typical repeat ran {jitter:.0%} behind its best")
    share = check.get("parent_cpu_share")
    if share is not None:
        text += f"; the ablation's own process (display, event relay) used {share:.1%} of a core while the runs ran"
    noise = next((r.result.noise for r in result.rungs if r.status == Status.DONE and r.result.noise), None)
    if noise and max(abs(drift), jitter) > max(2 * noise["sigma_log"], MACHINE_MOVED):
        text += (f": more than twice the runs' noise ({100 * noise['sigma_log']:.1f}%) and {MACHINE_MOVED:.0%}, so "
                 "the machine was busier "
                 "or throttled during part of the ladder; the interleaved order shares that among the rungs, but a "
                 "rerun on a quieter machine is the check")
    return text + "."


def settle_text(result: AblationResult) -> str:
    """The passes settling added after the repeats asked for, and why; "" when it added none."""
    settle = result.settings.get("settle")
    if not settle:
        return ""
    passes = settle["passes"]
    why = ", ".join(dict.fromkeys(name for p in passes for name in p["unsettled"]))
    min_effect = result.settings.get("min_effect", MIN_EFFECT)
    return (f"{len(passes)} pass(es) of every rung were added after the {passes[0]['repeat'] - 1} asked for, "
            f"because verdicts were within the noise or gains of {100 * min_effect:.0f}% or "
            f"more were not yet resolved ({why}), while another pass fitted in the {settle['within_s']:.0f} s "
            + ("allowed (tune: half the budget left when this stage began, all of it in the last stage). "
               if "stage" in result.settings else "of --settle-within. "))


def joint_agreement(result: AblationResult) -> float | None:
    """The chance that a rerun repeats every verdict against the baseline: the product of the verdicts' own
    chances (stats.rerun_agreement), which treats them as independent (they share the baseline's repeats, so
    this is a rough figure). A ladder of a dozen verdicts each repeated 90% of the time is repeated whole only
    ~30% of the time: the report says so rather than letting one run's table pass for the answer."""
    chances = [r.result.agreement for r in judged(result) if r.result.agreement is not None]
    return math.prod(chances) if chances else None
