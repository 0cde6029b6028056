"""`trainfast tune`: the fastest recipe for this model, data and machine that keeps accuracy.

Switches interact (channels_last pays in bf16 and not in fp32; compile pays only on a long enough run; O2
beats O1 on some models), so the top of a cumulative ladder is not always the best recipe. The search, in
two stages of the ablation's own run loop (ablate.run_ladder: interleaved repeats in fresh processes,
pooled-noise intervals, firm verdicts), each stage a folder of its own so an interrupted search resumes:

  1. singles/  every switch alone against the baseline: the precision levels (O1 and O2 in the device's
     fast half type), set_to_none, prefetch, channels_last, compile, fused, and for an image folder the
     decode cache.
 1b. on-level/ when a precision level gained: every other switch again, on top of that level (precision
     changes every kernel: channels_last, for one, pays in bf16 and not in fp32). With a level to try,
     stage 1 gets at most half the budget (SINGLES_SHARE): a switch it cannot fit is still judged here,
     in the precision the recipe will run. When no level gains, stage 1 goes on with that half instead.
     Under a tight budget a stage cuts its last switches: stage 1 runs them in PRIORITY order, stage 1b
     what gained in stage 1 first, then what stage 1 could not fit (on_level_order).
  2. combine/  the switches that gained (a firm "faster" that kept accuracy; one precision level, the
     fastest) together, against the baseline, the best single switch, and the combination without each
     one of them in turn: a switch whose removal makes the combination firmly faster hurts in combination
     and is dropped. compile joins only if the planned run repays its compilation (break_even_steps).

The recommendation is the combination (without what hurt) when it is firmly faster than the best single
switch, else the best single switch (the simpler recipe), else the baseline; every run of stage 2 trains
to the end and is evaluated, so the accuracy guard is the combination's own accuracy against the
baseline's noise band: a recipe that loses accuracy is not recommended, and the report says what was
dropped. Output: best.yaml (a recipe file `trainfast train --recipe best.yaml` takes as is), tune.md,
tune.json.
"""
from __future__ import annotations

import dataclasses
import math
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

from .ablate import (MIN_EFFECT, AblationResult, Rung, TimingBudget, _atomic_write, check_counts, check_measure,
                     plan_rungs, prepare_builtin, prepare_command, recipe_changes, rule_out_slow_half, rung_repeats,
                     run_ladder, trimmed)
from .recipe import Recipe, RecipeError, resolve_device
from .stats import FASTER, compare, pooled_noise
from .techniques.precision import SLOW_HALF, auto_amp_dtype, not_run_text, slow_half_reason

PRECISION_FIELDS = ("precision", "precision_level")
# With a precision level to try, stage 1 may spend at most this share of the budget: the rest is kept for
# stage 1b, the switches on top of the level, which is the recipe the user will run. Priced by the fp32
# baseline, stage 1 alone would otherwise take a tight budget whole (ResNet-18 at 128 on photos, 12 min:
# the fp32 singles of decode_cache, channels_last, compile and fused were cut and never judged anywhere).
SINGLES_SHARE = 0.5
# Passes added to settle a stage's verdicts may take it up to this share of the budget left when it starts
# (the last stage: all of it), so the stages after it keep theirs.
SETTLE_SHARE = 0.5


@dataclass
class Decision:
    """What the search found; everything the report and tune.json say."""
    recipe: Recipe
    name: str
    gainers: list[str] = field(default_factory=list)        # singles with a firm gain that kept accuracy
    combined: list[str] = field(default_factory=list)       # the switches put together
    dropped: dict[str, str] = field(default_factory=dict)   # switch -> why it is not in the recipe
    notes: list[str] = field(default_factory=list)
    speedup: float = 1.0
    speedup_interval: list[float] | None = None
    batch: dict[str, Any] | None = None      # --batch-size-search: reported apart, not in best.yaml


# Where the budget cannot fit every switch, a stage cuts its last ones: this order is the search's priority.
# After the precision levels (the largest gains where the device has a fast half type), the switches that make
# the arithmetic cheaper or take work off the data path (in our ablations: channels_last 1.16-1.30x on top of
# bf16 on conv nets, the decode cache ~1.08x on photos), then the bookkeeping ones, compile last (its runs are
# the slowest, and a short planned run does not repay it anyway).
PRIORITY = ("channels_last", "decode_cache", "set_to_none", "fused", "prefetch", "compile")


def single_names(amp: str, image_folder: bool) -> list[str]:
    return [f"autocast-{amp}", f"master-{amp}", *(n for n in PRIORITY if n != "decode_cache" or image_folder)]


def on_level_order(others: list[Rung]) -> list[Rung]:
    """Stage 1b's priority, from what stage 1 found in fp32: the switches that gained firmly there first (the
    largest first), then those it could not fit (PRIORITY order), then those that did not gain (the largest
    estimate first: a switch can pay on top of half precision and not in fp32, as channels_last does)."""
    def key(rung: Rung) -> tuple[int, float]:
        if rung.status != "done" or not rung.result.get("speedup"):
            return 1, float(PRIORITY.index(rung.name) if rung.name in PRIORITY else len(PRIORITY))
        return (0 if firm_gain(rung) else 2), -rung.result["speedup"]
    return sorted(others, key=key)


def singles_share(singles: list[Rung]) -> float:
    """The share of the budget stage 1 may spend: SINGLES_SHARE when a precision level and another switch
    are both to be run (stage 1b may follow), else all of it."""
    live = [r for r in singles[1:] if r.status != "no-effect"]
    levels = [r for r in live if any(k in r.changes for k in PRECISION_FIELDS)]
    return SINGLES_SHARE if levels and len(levels) < len(live) else 1.0


def kept_level(singles: list[Rung], in_combination: list[str]) -> Rung | None:
    """The precision level the combination keeps (combine keeps at most one), or None."""
    return next((r for r in singles if r.name in in_combination and any(k in r.changes for k in PRECISION_FIELDS)),
                None)


def firm_gain(rung: Rung) -> bool:
    r = rung.result
    return rung.status == "done" and r.get("verdict") == FASTER and r.get("firm", True) and not r.get("accuracy_worse")


def break_even_steps(compiled: Rung, eager: Rung) -> float:
    """Steps after which compile has repaid its compilation: the extra warm-up time (warm-up beyond what
    the same steps take once steady, compiled minus eager) over the steady time it saves per step.
    Infinite when it saves nothing."""
    def excess_and_step(rung: Rung) -> tuple[float, float]:
        excess, steps = [], []
        for run in rung.repeats:
            t = run["timing"]
            step = t["timed_seconds"] / t["timed_steps"] if t["timed_steps"] else math.inf
            excess.append(sum(t["warmup_seconds"]) - step * len(t["warmup_seconds"]))
            steps.append(step)
        return statistics.fmean(excess), statistics.fmean(steps)

    extra_c, step_c = excess_and_step(compiled)
    extra_e, step_e = excess_and_step(eager)
    saving = step_e - step_c
    return max(0.0, extra_c - extra_e) / saving if saving > 0 else math.inf


def combine(base: Recipe, singles: list[Rung], planned_steps: int | None) -> tuple[Recipe, list[str], dict[str, str]]:
    """The combination of the singles that gained: one precision level (O1, or another one firmly faster than
    it), every other gaining switch; compile only when `planned_steps` reaches its break-even. Returns the recipe, the
    switch names in it and why each other single is not."""
    baseline = singles[0]
    dropped: dict[str, str] = {}
    chosen: list[Rung] = []
    for rung in singles[1:]:
        r = rung.result
        if rung.status != "done":
            dropped[rung.name] = (not_run_text(rung.reason) if rung.effect == SLOW_HALF else
                                  {"no-effect": "no effect here", "failed": "failed"}.get(rung.status,
                                                                                          rung.reason or rung.status))
        elif r.get("accuracy_worse"):
            dropped[rung.name] = f"lost accuracy ({r['accuracy_delta']:+.3f}, outside the baseline's band)"
        elif not firm_gain(rung):
            dropped[rung.name] = f"no firm gain alone ({r.get('verdict_text', r.get('verdict'))})"
        else:
            chosen.append(rung)
    levels = [r for r in chosen if any(k in r.changes for k in PRECISION_FIELDS)]
    if len(levels) > 1:
        # One level: O1 (fp32 weights, the safer numerics) unless another is firmly faster than it.
        noise = pooled_noise([rung_repeats(r) for r in singles if r.status == "done"])
        levels.sort(key=lambda r: r.recipe.precision_level != "autocast")
        level = levels[0]
        for r in levels[1:]:
            versus = compare(r.name, rung_repeats(r), level.name, rung_repeats(level), MIN_EFFECT, noise)
            if versus.verdict == FASTER and versus.firm:
                level = r
        for r in levels:
            if r is not level:
                versus = compare(r.name, rung_repeats(r), level.name, rung_repeats(level), MIN_EFFECT, noise)
                dropped[r.name] = f"a precision level not firmly faster than {level.name} ({versus.text})"
        chosen = [r for r in chosen if r not in levels or r is level]
    compiled = next((r for r in chosen if r.changes.get("compile")), None)
    if compiled is not None:
        steps = break_even_steps(compiled, baseline)
        if planned_steps is not None and planned_steps < steps:
            dropped[compiled.name] = (f"compile repays its compilation after ~{steps:.0f} steps; the planned run "
                                      f"has {planned_steps}")
            chosen.remove(compiled)
    recipe = base
    for rung in chosen:
        recipe = recipe.replace(**rung.changes)
    return recipe, [r.name for r in chosen], dropped


def combine_stage(base: Recipe, singles: list[Rung], combined: Recipe, names: list[str],
                  changes: dict[str, dict] | None = None) -> list[Rung]:
    """Stage 2's rungs: the baseline, the best single switch (alone against fp32: the simplest recipe to
    beat), the combination, and the combination without each of its switches in turn (two switches or
    more). `changes`: each switch's fields, where they come from another stage than `singles`."""
    gained = [r for r in singles[1:] if r.name in names] or [r for r in singles[1:] if firm_gain(r)]
    best = max(gained, key=lambda r: r.result["speedup"])
    rungs = [Rung("baseline", {}, base), Rung(f"single-{best.name}", dict(best.changes), best.recipe),
             Rung("combined", recipe_changes(base, combined), combined)]
    if len(names) > 1:
        fields = changes or {r.name: r.changes for r in singles}
        for name in names:
            without = base
            for other in names:
                if other != name:
                    without = without.replace(**fields[other])
            rungs.append(Rung(f"without-{name}", recipe_changes(base, without), without))
    return rungs


BATCH_FACTORS = (2, 4, 8)


def on_level_decision(level: Rung, best: Rung, fallback: Decision) -> Decision:
    """The precision level plus the switch that gained most on top of it (stage 1b measured exactly that
    recipe). Its speed-up over the fp32 baseline is the product of the two measured ones, level over baseline
    and switch over level, from two stages; the interval multiplies their bounds (wider than a joint one)."""
    speedup = level.result["speedup"] * best.result["speedup"]
    a, b = level.result.get("speedup_interval"), best.result.get("speedup_interval")
    return Decision(best.recipe, f"{level.name} + {best.name}", gainers=fallback.gainers,
                    combined=[level.name, best.name], dropped=fallback.dropped, notes=fallback.notes,
                    speedup=speedup, speedup_interval=[a[0] * b[0], a[1] * b[1]] if a and b else None)


def batch_rungs(recipe: Recipe, train_size: int) -> list[Rung]:
    """The recommended recipe at its batch size and at 2x, 4x, 8x of it, while an epoch keeps at least two
    optimizer steps (a batch near the dataset's size would measure nothing but its last partial step)."""
    rungs = [Rung(f"batch-{recipe.batch_size}", {}, recipe)]
    for factor in BATCH_FACTORS:
        size = recipe.batch_size * factor
        if size * recipe.grad_accum_steps * 2 > train_size:
            break
        rungs.append(Rung(f"batch-{size}", {"batch_size": size}, recipe.replace(batch_size=size)))
    return rungs


def batch_finding(result: AblationResult) -> dict[str, Any]:
    """The largest batch that fits (its runs did not fail) and still gains: the ladder climbs from the
    recommended recipe's batch size while the next size is firmly faster in samples/s and keeps accuracy
    (ablate.pick_best on a cumulative ladder); what each size measured, for the report."""
    rungs = result.rungs
    sizes = {r.name: {"batch_size": r.recipe.batch_size, "status": r.status, "speedup": r.result.get("speedup"),
                      "speedup_interval": r.result.get("speedup_interval"), "verdict": r.result.get("verdict_text"),
                      "accuracy": r.result.get("accuracy"), "accuracy_worse": r.result.get("accuracy_worse"),
                      "peak_memory_bytes": r.result.get("peak_memory_bytes")} for r in rungs}
    failed = [r.recipe.batch_size for r in rungs if r.status == "failed"]
    return {"batch_size": result.best.batch_size, "from": rungs[0].recipe.batch_size, "tie": result.tie,
            "does_not_fit_or_failed": failed, "sizes": sizes}


def decide(stage: list[Rung], min_effect: float = MIN_EFFECT) -> Decision:
    """The recommendation from stage 2 (rungs as combine_stage made them, scored)."""
    base, single, combined = stage[0], stage[1], stage[2]
    without = stage[3:]
    noise = pooled_noise([rung_repeats(r) for r in stage if r.status in ("done", "partial")])

    def firmly_faster(a: Rung, b: Rung) -> tuple[bool, Any]:
        if a.status != "done" or b.status != "done":
            return False, None
        versus = compare(a.name, rung_repeats(a), b.name, rung_repeats(b), min_effect, noise)
        return versus.verdict == FASTER and versus.firm, versus

    decision = Decision(base.recipe, "baseline")
    final = combined
    for rung in without:                 # a switch whose removal makes the combination faster hurts in it
        better, versus = firmly_faster(rung, final)
        if better:
            name = rung.name.removeprefix("without-")
            decision.dropped[name] = f"hurts in combination: the combination without it is {versus.text}"
            final = rung
    if final.status == "done" and final.result.get("accuracy_worse"):
        decision.dropped[final.name] = (f"loses accuracy ({final.result['accuracy_delta']:+.3f}, outside the "
                                        "baseline's band)")
        final = None
    if final is not None:
        beats, versus = firmly_faster(final, single)
        if beats:
            decision.recipe, decision.name = final.recipe, final.name
        elif versus is not None:
            decision.notes.append(f"the combination ({final.name}) does not beat the best single switch "
                                  f"{single.name.removeprefix('single-')}: {versus.text}; the simpler recipe is recommended")
    if decision.name == "baseline" and firm_gain(single):
        decision.recipe, decision.name = single.recipe, single.name
    chosen = next(r for r in stage if r.name == decision.name)
    decision.speedup = chosen.result.get("speedup", 1.0)
    decision.speedup_interval = chosen.result.get("speedup_interval")
    return decision


def parse_budget(text: str) -> float:
    """'600', '600s', '10m', '1h' -> seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    value = text.strip().lower()
    try:
        seconds = float(value[:-1]) * units[value[-1]] if value and value[-1] in units else float(value)
    except ValueError:
        raise RecipeError(f"--budget {text!r}: a time like 600, 600s, 10m or 1h") from None
    if not seconds > 0:
        raise RecipeError(f"--budget {text!r} must be positive")
    return seconds


def tune(model: str = "resnet9", train_set=None, val_set=None, loss_fn=None, *, data: str = "digits",
         image_size: int | None = None, recipe: Recipe | None = None, device: str = "auto",
         out: str | Path | None = None, amp_dtype: str = "auto", repeats: int = 3, budget_s: float = 900.0,
         planned_steps: int | None = None, timing: TimingBudget | None = None, min_effect: float = MIN_EFFECT,
         resume: bool = False, show: bool = True, mean=None, std=None, switches: list[str] | None = None,
         command: Sequence[str] | None = None, nproc: int = 1, metric: str | None = None,
         goal: str | None = None, batch_size_search: bool = False, settle: bool = True) -> Decision:
    """Search for the fastest recipe that keeps accuracy (module docstring). `planned_steps`: the optimizer
    steps of the run the recipe is for (default: the recipe's epochs x steps per epoch), which decides
    compile. `budget_s`: the search plans within it; a stage that would not fit is shortened (fewer
    repeats, no leave-one-out rungs) or skipped, and the report says so. `switches`: search only these
    (names as single_names gives them, e.g. autocast-bf16, channels_last).

    `command`: search on a user's own training command instead of the built-in run (`trainfast tune --
    python train.py ...`; ablate.CommandWork): stages 1 and 1b time each run in speed mode; stage 2 runs every
    candidate to its end, so the accuracy guard compares the metric the script reports with `tf.report`
    (`metric`, `goal` as in ablate_command) with the baseline's band. `planned_steps` then decides compile
    (the script's run length is not known before it ends).

    `batch_size_search`: afterwards, the recommended recipe at 2x, 4x, 8x its batch size (stage batch/, a
    cumulative ladder): the largest that fits and is still firmly faster with accuracy kept is reported
    apart (decision.batch, tune.md), never written into best.yaml: a larger batch changes the optimization
    (steps per epoch, the learning rate it wants), which the user decides.

    `settle`: after a stage's planned `repeats` passes, more passes (up to ablate.MAX_REPEATS) while a verdict
    is within the noise and the budget allows (stage()); False: exactly `repeats` passes in every stage."""
    from datetime import datetime

    started = time.monotonic()
    timing = timing or TimingBudget()
    check_counts(noise_seeds=repeats, repeats=repeats, nproc=1, rung_timeout=None, min_effect=min_effect)
    out_dir = Path(out) if out is not None else Path("runs") / datetime.now().strftime("tune-%Y%m%d-%H%M%S")
    if out_dir.exists() and not resume and any(out_dir.iterdir()):
        raise RecipeError(f"{out_dir} already holds a search: pass --resume to continue it, or choose another --out")
    check_measure("full", goal)
    if batch_size_search and command is not None:
        raise RecipeError("--batch-size-search: a script sets its own DataLoader batch size, which the recipe "
                          "cannot change; search it with the built-in run, or in the script")
    if command is None:
        from .data.decoded_cache import effect as decode_cache_effect

        work = prepare_builtin(model, train_set, val_set, loss_fn, data=data, image_size=image_size,
                               recipe=recipe, device=device, mean=mean, std=std)
        base, dev, image_folder = work.base, work.dev, decode_cache_effect(work.split).acts
    else:
        base, dev, image_folder = recipe or Recipe(), resolve_device(device), False
    amp = auto_amp_dtype(dev) if amp_dtype == "auto" else amp_dtype
    names = single_names(amp, image_folder)
    if switches:
        unknown = [n for n in switches if n not in names]
        if unknown:
            raise RecipeError(f"--switches: {', '.join(unknown)} not among {', '.join(names)}")
        names = [n for n in names if n in switches]
    slow = slow_half_reason(dev, amp) if amp_dtype == "auto" else None

    def plan_singles() -> list[Rung]:
        rungs = [r for r in plan_rungs(base, names, "each", amp, dev) if r.name == "baseline" or r.name in names]
        rungs = rungs[:1] + sorted(rungs[1:], key=lambda r: names.index(r.name))       # the search's priority
        if slow:                            # a CPU without half-precision hardware: the levels are not run
            for rung in rungs:
                if "precision" in rung.changes:
                    rule_out_slow_half(rung, slow)
        return rungs

    singles = plan_singles()
    if command is not None:
        # Every candidate is a combination of the singles' fields: those are all a run may switch.
        work = prepare_command(command, [r.changes for r in singles], recipe=base, device=device, nproc=nproc,
                               measure="speed", budget=timing)
    work.mark_effects(singles)
    common = {**work.settings, "repeats": repeats, "budget": dataclasses.asdict(timing), "min_effect": min_effect,
              "device": str(dev)}

    def stage(name: str, rungs: list[Rung], stage_repeats: int, measure: str = "speed",
              mode: str = "each", share: float = 1.0, again: bool = False, credit_s: float = 0.0,
              last: bool = False) -> AblationResult:
        """One stage: speed for the singles (a command's runs stop once timed), full for stage 2, whose
        candidates are also judged on the metric (the built-in run always trains to its end). `again`: the
        stage's folder is resumed (its runs so far reused, at no cost), with `credit_s`, what they took, added
        to its time so its plan prices them like the runs still to come.

        With `settle`, the budget the planned passes leave is spent where it changes an answer: more passes
        while a verdict is marked ? or a gain of min_effect or more is unresolved (run_ladder's settling, as
        in `ablate`), until the stage has taken SETTLE_SHARE of the budget left when it started (all of it
        in the `last` stage), so later stages keep their time. A default search that stopped after 3 passes
        left channels_last on top of bf16 at 1.14x (1.02-1.27) "no measurable difference ?" with 12 of its
        15 minutes unused."""
        left = budget_s - (time.monotonic() - started)
        allowed = share * left + credit_s
        settle_s = min(allowed, (left if last else SETTLE_SHARE * left) + credit_s) if settle else 0.0
        settings = {**common, "stage": name, "mode": mode, "repeats": stage_repeats, "noise_seeds": stage_repeats,
                    "measure": measure, "rungs": {r.name: r.recipe.to_dict() for r in rungs if r.status != "no-effect"}}
        return run_ladder(rungs, work.launcher(measure), settings, out_dir / name, dev, repeats=stage_repeats,
                          noise_seeds=stage_repeats, budget=timing, min_effect=min_effect, mode=mode,
                          resume=resume or again, rung_timeout=None, show=show,
                          flops_per_sample=work.flops_per_sample, after_run=work.after_run(rungs),
                          metric=work.metric(measure, metric, goal), time_budget_s=allowed,
                          settle_within_s=settle_s)

    def cut_note(result: AblationResult, why: str = "") -> None:
        cut = result.settings.get("budget_cut")
        if trimmed(cut):
            asked = cut["asked"]["repeats"]
            what = [f"{cut['repeats']} repeats instead of {asked}"] if cut["repeats"] < asked else []
            what += [f"without {', '.join(cut['skipped'])}"] if cut["skipped"] else []
            skipped.append(f"{result.settings['stage']}: ran {' and '.join(what)} to fit the budget "
                           f"(~{cut['seconds_per_run']:.0f} s a run){why}")

    skipped: list[str] = []
    share = singles_share(singles)
    first_started = time.monotonic()
    first = stage("singles", singles, repeats, share=share)
    steps = planned_steps or next((run.get("steps") for run in singles[0].repeats), None)
    combined, in_combination, dropped = combine(base, singles, steps)
    cut = first.settings.get("budget_cut")
    if share < 1 and trimmed(cut) and not kept_level(singles, in_combination) and \
            budget_s - (time.monotonic() - started) >= cut["seconds_per_run"]:
        # No precision level gained, so there is no stage 1b to keep the rest of the budget for: stage 1 goes
        # on with all of it, re-planned as if it had had it from the start (its runs so far reused).
        singles = plan_singles()
        work.mark_effects(singles)
        first = stage("singles", singles, repeats, again=True, credit_s=time.monotonic() - first_started)
        combined, in_combination, dropped = combine(base, singles, steps)
        share = 1.0
        skipped.append("no precision level gained firmly, so stage 1 went on with the budget kept for stage 1b")
    cut_note(first, f"; {1 - share:.0%} of the budget was kept for stage 1b, where a switch cut here is judged on "
                    f"top of the precision level if one gains" if share < 1 else "")
    per_run = statistics.fmean([run.get("wall_time_s") or 0 for r in singles for run in r.repeats] or [0])
    if steps is None and "compile" in in_combination:
        skipped.append("the planned run's length is not known (a command's runs stop once timed): compile was "
                       "kept without its break-even check; pass --planned-steps to decide it")
    second = on_level = None
    level = kept_level(singles, in_combination)
    others = [r for r in singles[1:] if r.status != "no-effect" and not any(k in r.changes for k in PRECISION_FIELDS)]
    if level is not None and others:
        # Precision changes every kernel, so the other switches are judged again on top of the chosen level:
        # channels_last, for one, pays in bf16 and not in fp32.
        rungs = [Rung(f"on-{level.name}", dict(level.changes), level.recipe)]
        rungs += [Rung(r.name, dict(r.changes), level.recipe.replace(**r.changes)) for r in on_level_order(others)]
        # Run when the level and one switch fit twice: the stage cuts itself to the budget (run_ladder).
        if per_run * 2 * min(repeats, 2) <= budget_s - (time.monotonic() - started):
            on_level = stage("on-level", rungs, repeats)
            cut_note(on_level)
            on_top, names_on_top, dropped_on_top = combine(level.recipe, rungs, steps)
            combined, in_combination = on_top, [level.name, *names_on_top]
            levels = {r.name for r in singles if any(k in r.changes for k in PRECISION_FIELDS)}
            dropped = {k: v for k, v in dropped.items() if k in levels}     # the others: judged on top instead
            dropped.update({k: f"on top of {level.name}: {v}" for k, v in dropped_on_top.items()})
        else:
            skipped.append(f"the switches were not judged again on top of {level.name} (would not fit the budget)")
    if not in_combination:
        decision = Decision(base, "baseline", dropped=dropped,
                            notes=["no switch gained firmly on its own: the baseline is recommended"])
    elif len(in_combination) == 1 or per_run * 3 * min(repeats, 2) > budget_s - (time.monotonic() - started):
        # One switch gained, or no time left to measure a combination (3 rungs, 2 repeats at the least): the
        # single switch that gained most, as measured alone; or, where switches gained on top of the level,
        # the best of those: the level plus that switch is a recipe stage 1b measured.
        only = max((r for r in singles if r.name in in_combination and firm_gain(r)),
                   key=lambda r: r.result["speedup"])       # the singles' speed-ups: all against the fp32 baseline
        decision = Decision(only.recipe, only.name, gainers=list(in_combination), combined=[only.name],
                            dropped=dropped, speedup=only.result["speedup"],
                            speedup_interval=only.result.get("speedup_interval"),
                            notes=["one switch gained: nothing to combine"] if len(in_combination) == 1 else [])
        on_top = [r for r in (on_level.rungs[1:] if on_level else []) if r.name in in_combination and firm_gain(r)]
        if len(in_combination) > 1 and on_top and level is not None:
            decision = on_level_decision(level, max(on_top, key=lambda r: r.result["speedup"]), decision)
        if len(in_combination) > 1 and set(decision.combined) == set(in_combination):
            skipped.append(f"stage 2 was skipped (would not fit the budget); it had nothing to add: stage 1b "
                           f"measured {decision.name}, all that gained, together")
        elif len(in_combination) > 1:
            skipped.append(f"stage 2 was skipped (would not fit the budget): {', '.join(in_combination)} were not "
                           f"measured together; {decision.name} is recommended, the best measured recipe")
    else:
        rungs = combine_stage(base, singles, combined, in_combination,
                              {r.name: r.changes for r in [*singles, *(on_level.rungs if on_level else [])]})
        stage_repeats = repeats
        left = budget_s - (time.monotonic() - started)
        if per_run * len(rungs) * stage_repeats > left and stage_repeats > 2:
            stage_repeats = 2
            skipped.append(f"stage 2 ran {stage_repeats} repeats instead of {repeats} to fit the budget")
        if per_run * len(rungs) * stage_repeats > left:
            rungs = rungs[:3]
            skipped.append("the leave-one-out rungs (the combination without each switch) were skipped to fit "
                           "the budget: harmful interactions were not looked for")
        second = stage("combine", rungs, stage_repeats, measure="full", last=not batch_size_search)
        cut_note(second)
        decision = decide(second.rungs, min_effect)
        decision.gainers = list(in_combination)
        decision.combined = list(in_combination)
        decision.dropped = {**dropped, **decision.dropped}
    compiled = next((r for r in singles if r.changes.get("compile") and r.status == "done"), None)
    if compiled is not None and singles[0].status == "done":
        even = break_even_steps(compiled, singles[0])
        decision.notes.append(f"compile repays its compilation after ~{even:.0f} steps" if math.isfinite(even) else
                              "compile saved no time per step here: it never repays its compilation")
    batch = None
    if batch_size_search:
        rungs = batch_rungs(decision.recipe, len(work.split.train))
        if len(rungs) < 2:
            skipped.append("--batch-size-search: no larger batch leaves two steps an epoch on this data")
        elif per_run * len(rungs) * repeats > budget_s - (time.monotonic() - started):
            skipped.append("--batch-size-search was skipped: it would not fit the budget")
        else:
            batch = stage("batch", rungs, repeats, mode="cumulative", last=True)
            cut_note(batch)
            decision.batch = batch_finding(batch)
    decision.notes += skipped
    write_outputs(out_dir, decision, first, second, time.monotonic() - started, budget_s, steps, on_level, batch)
    if show:
        print(f"recommended: {decision.name} ({decision.speedup:.2f}x the baseline) — {out_dir}/best.yaml, "
              f"{out_dir}/tune.md")
    return decision


def write_outputs(out_dir: Path, decision: Decision, singles: AblationResult, combined: AblationResult | None,
                  seconds: float, budget_s: float, planned_steps: int | None,
                  on_level: AblationResult | None = None, batch: AblationResult | None = None) -> None:
    import yaml

    from .checkpoint import atomic_write_text
    from .report import Columns, _markdown_table, headers, table_rows

    atomic_write_text(out_dir / "best.yaml", "# trainfast tune: the recommended recipe (trainfast train --recipe "
                      "best.yaml)\n" + yaml.safe_dump(decision.recipe.to_dict(), sort_keys=False))

    def summary(result: AblationResult | None) -> dict[str, Any]:
        return {r.name: {"status": r.status, "changes": r.changes, "verdict": r.result.get("verdict"),
                         "speedup": r.result.get("speedup"), "speedup_interval": r.result.get("speedup_interval"),
                         "firm": r.result.get("firm"), "accuracy": r.result.get("accuracy"),
                         "accuracy_worse": r.result.get("accuracy_worse")}
                for r in (result.rungs if result else [])}

    data = {"recommended": decision.name, "recipe": decision.recipe.to_dict(), "speedup": decision.speedup,
            "speedup_interval": decision.speedup_interval, "combined": decision.combined,
            "dropped": decision.dropped, "notes": decision.notes, "search_seconds": seconds, "budget_seconds": budget_s,
            "planned_steps": planned_steps, "singles": summary(singles), "on_level": summary(on_level),
            "combine": summary(combined), "batch_search": decision.batch}
    _atomic_write(out_dir / "tune.json", data)
    interval = decision.speedup_interval
    columns = Columns(cumulative=False)
    lines = ["# trainfast tune", "",
             f"Recommended: **{decision.name}**, {decision.speedup:.2f}x the baseline"
             + (f" (95% interval {interval[0]:.2f}–{interval[1]:.2f})" if interval else "") + ", written to "
             f"[best.yaml](best.yaml). The search took {seconds:.0f} s (budget {budget_s:.0f} s); planned run: "
             f"{planned_steps} optimizer steps.", "",
             "## Each switch alone (stage 1)", "", _markdown_table(headers(columns), table_rows(singles.rungs, columns)),
             "", "Details: [singles/report.md](singles/report.md).", ""]
    if on_level is not None:
        lines += [f"## On top of {on_level.rungs[0].name.removeprefix('on-')} (stage 1b)", "",
                  "Every other switch again, against the precision level alone.", "",
                  _markdown_table(headers(columns), table_rows(on_level.rungs, columns)), "",
                  "Details: [on-level/report.md](on-level/report.md).", ""]
    if combined is not None:
        lines += ["## Together (stage 2)", "", f"Combined: {', '.join(decision.combined)}; the best single switch "
                  "and the combination without each switch in turn, against the same baseline.", "",
                  _markdown_table(headers(columns), table_rows(combined.rungs, columns)), "",
                  "Details: [combine/report.md](combine/report.md).", ""]
    if batch is not None and decision.batch is not None:
        found = decision.batch
        advice = (f"batch size {found['batch_size']} is the largest that was still firmly faster and kept "
                  f"accuracy: `trainfast train --recipe best.yaml --batch-size {found['batch_size']}` (a larger batch "
                  "takes fewer steps an epoch and usually wants a larger learning rate: check the accuracy at "
                  "your full length)" if found["batch_size"] != found["from"] else
                  f"no larger batch was firmly faster with accuracy kept: batch size {found['from']} stays")
        lines += ["## Larger batches (reported apart: not in best.yaml)", "",
                  "The recommended recipe at larger batch sizes, each against the size above it (a cumulative "
                  f"ladder); accuracy after the same epochs. {advice}.", "",
                  _markdown_table(headers(Columns(cumulative=True)), table_rows(batch.rungs, Columns(cumulative=True))),
                  "", "Details: [batch/report.md](batch/report.md).", ""]
    lines += ["## Not in the recipe", ""] + [f"- **{name}**: {why}" for name, why in decision.dropped.items()]
    if decision.notes:
        lines += ["", "## Notes", ""] + [f"- {note}" for note in decision.notes]
    (out_dir / "tune.md").write_text("\n".join(lines) + "\n")
