"""A language model's batches and attention: the share of each batch that is padding, with what packing the
documents would save on this run's own step (measured), and the attention backend against the others this device
runs. Neither says anything on a run with no padded documents (an image model, a run that already packs)."""
from __future__ import annotations

import shlex

from .findings import MATERIAL_SHARE, Finding, Observations, ms, pct


def padding(obs: Observations) -> Finding | None:
    seen = (obs.text or {}).get("padding")
    if not seen or seen.get("packed"):
        return None
    name = "padding in the batches"
    share = seen["share"]
    padded, packed = seen.get("padded_s"), seen.get("packed_s")
    text = (f"{pct(share)} of the positions the model computes are padding (over {seen['batches']} batches: each "
            "is as long as its longest document)")
    if seen.get("cannot_pack"):
        return Finding(name, "time", "measured", f"{text}; packing cannot act on them: {seen['cannot_pack']}")
    if not padded or not packed:
        return Finding(name, "time", "measured", text)
    saving = 1 - packed / padded
    how = ("one batch replayed" if obs.recipe_flags else
           "one of its batches, a forward and backward of its model each")
    text += (f"; the same documents packed without padding took {ms(packed)} a step against {ms(padded)} padded "
             f"({how}, the two alternating): {pct(saving)} of the step")
    if saving >= MATERIAL_SHARE:
        cost = padded - packed
        return Finding(name, "time", "problem", text, cost, cost / (obs.step_s or padded), padding_fix(obs))
    return Finding(name, "time", "measured", text + ": below the share that makes packing pay here")


def padding_fix(obs: Observations) -> str:
    """The switch that packs: the built-in run's flag, or the ablation of the user's command, which packs a
    Trainer script's or a Session loop's batches after their own collator and keeps them only if the metric
    holds."""
    ablate = "trainfast ablate --switches padding_free,group_by_length"
    if obs.recipe_flags:
        return (f"--padding-free (packs each batch's documents, attention kept inside each; `{ablate}` measures it "
                "with the accuracy guard)")
    command = shlex.join(obs.command) if obs.command else "COMMAND"
    return (f"`{ablate} -- {command}`: packs the script's padded batches after its own collator (a Trainer's, or "
            "a trainfast.Session's loader), position ids restarting at each document, and measures it with the "
            "accuracy guard; a loop of its own packs them itself (trainfast.text.batching.pack)")


def attention_backend(obs: Observations) -> Finding | None:
    seen = (obs.text or {}).get("attention_backend")
    if not seen or seen.get("in_use") is None:
        return None
    name = "attention backend"
    current, seconds = seen["in_use"], seen.get("seconds") or {}
    if not seconds:
        return Finding(name, "time", "measured", f"{current}; no other backend runs here without compiling")
    timings = ", ".join(f"{b} {ms(s)}" for b, s in sorted(seconds.items(), key=lambda kv: kv[1]))
    best = min(seconds, key=seconds.get)
    text = f"{current} in use; a step with each backend this device runs (one batch replayed): {timings}"
    if best != current and 1 - seconds[best] / seconds[current] >= MATERIAL_SHARE:
        cost = seconds[current] - seconds[best]
        command = shlex.join(obs.command) if obs.command else "COMMAND"
        fix = (f"--attention {best} (the model's attn_implementation)" if obs.recipe_flags else
               f"the model's attn_implementation=\"{best}\" (`trainfast ablate --switches {best} -- {command}` "
               "measures it)")
        return Finding(name, "time", "problem", text, cost, cost / (obs.step_s or seconds[current]), fix)
    return Finding(name, "time", "fine", text)
