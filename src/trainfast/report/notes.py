"""report.md's Notes: per rung, why it was not run or failed, and what qualifies its numbers (input-bound,
disturbed steps, skipped files, the loss scaler, a risky precision level), then a rate above the ceiling."""
from __future__ import annotations

import statistics

from ..checks import INPUT_BOUND_SHARE
from ..instruments.recompiles import describe as describe_compiles
from ..results import AblationResult, EffectLabel, Rung, Status
from ..stats import SLOWER
from ..techniques import threads
from ..techniques.precision import level_note
from .format import fmt_sig, rung_label
from .observed import observed_note
from .recompiled import evaluation_text, left_out_texts, recompiled_notes

FEW_CLEAN_STEPS = 8     # fewer clean steps than this in a run: too few for a firm verdict


def rung_notes(result: AblationResult) -> list[str]:
    """The Notes section's items: the rungs ruled out, the reasons given for the others, the failures with
    their log tails, then each rung's caveats and a rate above the measured ceiling."""
    rungs = result.rungs
    items = task_note(result.settings) + framework_notes(result.settings)
    items += no_session_note([r for r in rungs if r.status == Status.NO_EFFECT and r.effect == EffectLabel.NO_SESSION])
    items += [ruled_out_note(r) for r in rungs if r.status == Status.NO_EFFECT and r.effect != EffectLabel.NO_SESSION]
    items += [f"- **{rung_label(r)}**: {r.reason}" for r in rungs
              if r.status in (Status.DONE, Status.SKIPPED) and r.reason]
    items += observed_note(rungs)
    items += [failure_note(r) for r in rungs if r.status == Status.FAILED]
    items += [f"- **{rung_label(r)}**: {text}" for r in rungs for text in caveats(r, result.settings)]
    above = above_ceiling_note(rungs)
    if above:
        items.append(f"- {above}")
    return items


TASK_WORDS = {"lm": "a language model (token ids in its batches)", "classification": "an image model",
              "detection": "a detector (images and targets with boxes)"}


def task_note(settings: dict) -> list[str]:
    """A script's task: given with --task, or read from its first training forward, and whether its ladder
    replaced the default one."""
    task = settings.get("script_task")
    if not task:
        return []
    what = TASK_WORDS.get(task["name"], task["name"])
    whole = ([WHOLE_RUN] if settings.get("whole_run") else [])
    if task["from"] == "--task":
        return [f"- **task**: {what}, as --task {task['name']} said: its ladder", *whole]
    ladder = "; its own ladder replaced the default one" if task.get("ladder") else ""
    return [f"- **task**: {what} (`{task['name']}`), read from its first training forward: {task['from']}{ladder}",
            *whole]


WHOLE_RUN = ("- **timed whole**: the script's batches are token ids, so each run was timed over every step after "
             "its warm-up to its end, in tokens: a step's work varies with its documents' lengths, and a window of "
             "steps would time whichever batches it held (length grouping and packing change which). Every rung's "
             "runs trained on the same documents. A shorter run of the script (its own max_steps or epochs) "
             "shortens every rung")


def framework_notes(settings: dict) -> list[str]:
    """A framework's script (transformers Trainer, Lightning, Accelerate): how its rungs were switched, what
    the script had set itself, and a baseline switch the framework did not end up with."""
    if not settings.get("framework"):
        return []
    items = [f"- **{settings['framework']}**: every rung switched the script through the framework's own settings "
             "from inside its process, each proven by reading it back from what the framework built (per run: "
             "`frameworks` in the rung's result.json)"] if not settings.get("plain_loop") else [PLAIN_LOOP]
    if settings.get("script_settings"):
        items.append("- the script's own settings, replaced in every run by the rung's value: "
                     + ", ".join(f"`{s}`" for s in settings["script_settings"]))
    if settings.get("baseline_not_applied"):
        items.append(f"- **baseline**: not every switch was turned off: {settings['baseline_not_applied']}")
    return items


PLAIN_LOOP = ("- **plain loop** (no trainfast.Session, no framework): every rung switched the script's model, "
              "optimizer and training loader through the probe's hooks in its process, each read back from the "
              "running loop (per run: `frameworks` and `observed` in the rung's result.json); the script itself "
              "was not edited, and what it turned on itself was left on")


def no_session_note(rungs: list[Rung]) -> list[str]:
    """The rungs a script without a Session cannot take, in one item per reason (one reason, in practice)."""
    by_reason: dict[str, list[str]] = {}
    for rung in rungs:
        by_reason.setdefault(rung.reason, []).append(rung_label(rung))
    return [f"- **{', '.join(labels)}**: no effect — {reason}" for reason, labels in by_reason.items()]


def ruled_out_note(rung: Rung) -> str:
    what = {EffectLabel.NO_SESSION: "no effect", EffectLabel.SLOW_HALF: "not run",
            EffectLabel.NOT_APPLICABLE: "not applicable",
            EffectLabel.NOT_APPLIED: "not applied (its runs were not timed as a result)"}.get(rung.effect,
                                                                                        "no effect on this device")
    return f"- **{rung_label(rung)}**: {what} — {rung.reason}"


def failure_note(rung: Rung) -> str:
    """The error, and the end of the failed run's log indented under it."""
    tail = rung.result.log_tail or ""
    block = "\n\n  ```\n" + "\n".join("  " + line for line in tail.splitlines()) + "\n  ```" if tail else ""
    return f"- **{rung_label(rung)}**: failed — {rung.result.error}" + block


INPUT_HELD = 0.8      # an epoch under this share of its step alone is held by its input


def caveats(rung: Rung, settings: dict | None = None) -> list[str]:
    """What qualifies a rung's numbers, in words: what a reader should know before trusting or comparing them."""
    r, done = rung.result, rung.status == Status.DONE
    out = []
    if done and (r.data_wait_fraction or 0) > INPUT_BOUND_SHARE:
        out.append(f"input-bound — {100 * r.data_wait_fraction:.0f}% of the timed steps was spent waiting for data"
                   + (" (the device idle for lack of a batch)" if r.copy_fraction is not None else ""))
    if done and r.epoch_of_step is not None and r.epoch_of_step < INPUT_HELD:
        out.append(input_held_note(rung, settings or {}))
    contradiction = roof_contradiction(r)
    if done and contradiction:
        out.append(contradiction)
    busy = [f"seed {run.get('seed', i)}" for i, run in enumerate(rung.repeats) if run["timing"].get("all_disturbed")]
    if done and busy:
        out.append(f"in the run(s) of {', '.join(busy)} every block of steps was disturbed (other processes used "
                   "more than a quarter of the machine throughout): their rate comes from disturbed steps; run it "
                   "again on a quieter machine")
    disturbed = sum(r.disturbed_steps or [])
    if done and disturbed:
        clean = sum(r.timed_steps or [])
        runs = ", ".join(f"seed {run.get('seed', i)}: {run['timing'].get('disturbed_steps', 0)}"
                         for i, run in enumerate(rung.repeats) if run["timing"].get("disturbed_steps"))
        out.append(f"{disturbed} step(s) left out as disturbed (other processes used more than a quarter of the "
                   f"machine meanwhile), in the run(s) of {runs}; its rate comes from {clean} clean steps"
                   + (" — too few for a firm verdict: run it again on a quieter machine"
                      if min(r.timed_steps or [0]) < FEW_CLEAN_STEPS else ""))
    if done:
        out += outlier_notes(rung)
        out += pairing_notes(rung)
    if done and r.skipped_files:
        out.append(f"{r.skipped_files} unreadable image(s) skipped (paths in the rung's log)")
    if done and r.host_decoded_files:
        named = "; ".join(r.host_decoded_named)
        out.append(f"{r.host_decoded_files} image(s) decoded on the host instead of the device (device_decode takes "
                   f"RGB and grayscale JPEGs)" + (f", e.g. {named}" if named else ""))
    state = r.precision_state or {}
    if "loss_scale" in state:
        out.append(f"loss scaler final scale {state['loss_scale']:g}, {state['skipped_steps']} skipped step(s)"
                   + (f", longest run of skips {state['longest_skip_run']}" if state.get("longest_skip_run") else ""))
    # The repeat that recompiled most (a limit hit first): the one whose timing it touched.
    counted = [c for run in rung.repeats if (c := (run.get("compile") or {}).get("run"))]
    compiled = describe_compiles(max(counted, key=lambda c: (c["limit_hits"], c["recompiles"]), default=None))
    if done and compiled:
        out.append(compiled)
    if done:
        out += compiled_left_out_notes(rung)
        out += [text] if (text := evaluation_text(rung.repeats)) else []
    risk = level_note(rung.recipe)
    if risk:
        out.append(risk)
    # The switch's own verdict: against the rung above in a cumulative ladder, else against the baseline.
    own = (r.vs_previous or {}).get("verdict") or r.verdict
    if done and threads.wanted(rung.changes) and own == SLOWER and isinstance(r.num_workers, int):
        out.append(threads.slower_note(r.num_workers))
    return out


def compiled_left_out_notes(rung: Rung) -> list[str]:
    """Each run whose timed steps held a recompile: its steps, left out of the rate as warm-up (measure.Timing)."""
    out = []
    for i, run in enumerate(rung.repeats):
        out += [f"seed {run.get('seed', i)}: {text}" for text in left_out_texts(run)]
        out += recompiled_notes(run, run.get('seed', i))          # a repeat where leaving them out was not enough
    return out


OUTLIER = 1.5   # a run this much slower than the median of its twins is named: far past any run-to-run noise (a few %)


def outlier_notes(rung: Rung) -> list[str]:
    """The runs of a rung far slower than their twins, each named with what its process saw: the machine took its
    cores (a run is slowed by other work, never sped up), so the rung's interval and verdict rest on a disturbed
    run, and the ablation is worth running again on a quiet machine."""
    runs = [(i, run, rate) for i, run in enumerate(rung.repeats) if (rate := run_rate(run))]
    out = []
    for i, run, rate in runs:
        others = [other for j, _, other in runs if j != i]
        if not others:
            continue
        ratio = statistics.median(others) / rate
        if ratio < OUTLIER:
            continue
        process, timing = run.get("process") or {}, run["timing"]
        seen = []
        if process.get("preempted") is not None:
            seen.append(f"its process was preempted {process['preempted']:,} times")
        blocks = timing.get("blocks") or []
        shares = [b["foreign_share"] for b in blocks if b.get("foreign_share") is not None]
        if shares:
            seen.append(f"other processes used {100 * statistics.fmean(shares):.0f}% of the machine while it stepped "
                        f"({sum(b['disturbed'] for b in blocks)} of {len(blocks)} blocks disturbed)")
        twins = ", ".join(fmt_sig(other) for other in others)
        head = (f"the run of seed {run.get('seed', i)} measured {fmt_sig(rate)}/s, {ratio:.1f}x slower than its "
                f"twin(s) ({twins})" + (f"; {'; '.join(seen)}" if seen else ""))
        own = own_slowdown(rung, blocks, shares)
        out.append(head + (f": {own}; this rung's interval and verdict rest on it: more repeats, or a longer run, "
                           "would outweigh it" if own else
                           ": far past the noise between runs, so the machine most likely took its cores; this "
                           "rung's interval and verdict rest on it: run the ablation again on a quiet machine"))
    return out


QUIET_MACHINE = 0.05      # other processes' mean share of the machine below which a slow run is its own doing


def own_slowdown(rung: Rung, blocks: list[dict], shares: list[float]) -> str | None:
    """Why a slow run was slow by its own work, when the machine was measured quiet around it (no block disturbed,
    other processes under QUIET_MACHINE): its slowest block of steps against its median, and for a compiled rung
    the likely cause, a compilation for a new input shape inside the timed steps that its twins found in the
    compile cache. None when the machine was not seen quiet (the machine is then the likely cause)."""
    if not shares or any(b.get("disturbed") for b in blocks) or statistics.fmean(shares) >= QUIET_MACHINE:
        return None
    per_step = [b["seconds"] / b["steps"] for b in blocks if b.get("steps")]
    if not per_step:
        return None
    why = (f"the machine was quiet, so the time is the run's own: its slowest block took {fmt_sig(max(per_step))} s a "
           f"step against a median of {fmt_sig(statistics.median(per_step))} s")
    if rung.recipe.compile:
        why += (" (the rung compiles: most likely a compilation for a new input shape inside the timed steps, "
                "which the runs after it found in the compile cache)")
    return why


def run_rate(run: dict) -> float | None:
    """A run's rate as the scoring counts it: samples over seconds of its clean blocks (all of them when every
    block was disturbed), times its ranks."""
    blocks = (run.get("timing") or {}).get("blocks") or []
    kept = [b for b in blocks if not b.get("disturbed")] or blocks
    seconds = sum(b["seconds"] for b in kept)
    return sum(b["samples"] for b in kept) * run.get("world_size", 1) / seconds if seconds > 0 else None


def pairing_notes(rung: Rung) -> list[str]:
    """How the rung's in-process pairing against the baseline went (ablation/paired.py): why it was compared
    across processes only, and the runs whose paired blocks other processes disturbed (left out)."""
    pairs = [(run.get("seed", i), run.get("paired")) for i, run in enumerate(rung.repeats)]
    why = sorted({p["unpaired"] for _, p in pairs if p and "unpaired" in p})
    out = [f"compared across fresh processes only, not in-process against the baseline: {w}" for w in why]
    hit = [(seed, sum(b["disturbed"] for side in p["blocks"].values() for b in side)) for seed, p in pairs
           if p and "blocks" in p]
    hit = [(seed, n) for seed, n in hit if n]
    if hit:
        out.append("in-process blocks left out as disturbed (other processes used more than a quarter of the machine "
                   "meanwhile), in the run(s) of " + ", ".join(f"seed {seed}: {n}" for seed, n in hit))
    return out


def input_held_note(rung: Rung, settings: dict) -> str:
    """An epoch well under its step alone: the input holds it. What the arithmetic bought and what the epoch
    kept of it, and the input switches this rung has not turned on that would close the gap."""
    r = rung.result
    bought = (f"step alone {r.step_alone_speedup:.2f}x the baseline's, epoch {r.speedup:.2f}x: "
              if r.step_alone_speedup and r.speedup and rung.name != "baseline" else "")
    text = (f"{bought}the epoch runs at {100 * r.epoch_of_step:.0f}% of its step alone — the input holds it "
            f"(the recommendation stays on the epoch)")
    fixes = input_switches(rung.recipe, settings)
    return text + (f"; input switches not on in this rung, each measurable as a rung: {', '.join(fixes)}"
                   if fixes else "")


def input_switches(recipe, settings: dict) -> list[str]:
    """The input switches a recipe has not turned on (techniques.held_input_rungs), those that can act on this
    device (their device_effect on the run's kind of device) and data (one on image-folder files where the data is
    such a folder)."""
    import torch

    from ..techniques import device_model_effect, held_input_rungs, owner

    device = torch.device("cuda" if str(settings.get("device", "")).startswith("cuda") else "cpu")
    folder = str(settings.get("data", "")).startswith("imagefolder")

    def acts(field: str) -> bool:
        return device_model_effect(field, device, None).acts and (folder or owner(field).data != "image_folder")
    return [rung.held_note[1] for rung in held_input_rungs()
            if not all(getattr(recipe, f) for f in rung.changes) and all(acts(f) for f in rung.changes)]


def roof_contradiction(r) -> str | None:
    """The wait and the roof fraction checked against each other: the steps' compute part (what is not waiting
    for or copying input) cannot run above the roof. A figure pair that implies it does is said, not hidden."""
    if not r.ceiling_fraction or r.data_wait_fraction is None:
        return None
    compute = 1 - r.data_wait_fraction - (r.copy_fraction or 0)
    if compute <= 0 or r.ceiling_fraction / compute <= 1.05:
        return None
    return (f"its wait ({100 * r.data_wait_fraction:.0f}%) and its share of the matmul peak "
            f"({100 * r.ceiling_fraction:.0f}%) disagree: the remaining compute would run at "
            f"{100 * r.ceiling_fraction / compute:.0f}% of the peak; read the wait as an upper bound")


def above_ceiling_note(rungs: list[Rung]) -> str | None:
    """Said when a rung's model FLOP/s exceeds the measured matmul ceiling, which a peak cannot allow."""
    above = [rung_label(r) for r in rungs if r.status == Status.DONE and (r.result.ceiling_fraction or 0) > 1]
    if not above:
        return None
    return (f"{', '.join(above)} ran above 100% of the measured matmul peak. The peak is the best of a few "
            "2048x2048 products before and after the ladder; a model whose layers are larger or better fused than "
            "one such product, a machine that ran faster during the ladder than during those probes (a shared or "
            "throttled machine), or a FLOP count that overstates the model's work can all exceed it. Compare "
            "the rungs with each other here, not with 100%.")
