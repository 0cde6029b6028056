"""The built-in switches trainfast could apply to a script's loop as it is (`ablate --switches NAME -- COMMAND`: a
plain loop through the probe's hooks, a Session or a framework's script through theirs), named from what the run was
seen doing (Observations.observed, probe/observe.py): an fp32 training forward (amp), an uncompiled model (compile),
an optimizer off its fused implementation (fused), a training loader without workers (workers; unpinned batches on
a GPU), conv weights in NCHW (channels_last).

Each says its saving where the doctor measured one (the loader's: the loop's own wait for each batch, which workers
can win back at most, less what a worker adds to hand a batch over) and says "not measured" where it did not, with
the ablation that measures it: the doctor times the loop as it is, never the loop with a switch on, so a figure
for compile or fused here would be a guess.
"""
from __future__ import annotations

import shlex

from .findings import NOT_HERE, SWITCH, Finding, Observations, ms, pct
from .loader import workers_cannot_pay

NOT_MEASURED = "its saving is not measured here (the doctor times the loop as it is, not with the switch on)"


def ablate(obs: Observations, rung: str) -> str:
    command = shlex.join(obs.command) if obs.command else "COMMAND"
    return f"`trainfast ablate --switches {rung} -- {command}` applies it to the script as it is and measures it"


def candidate(obs: Observations, rung: str, what: str, seen: str, model_level: bool = True,
              cost_s: float | None = None, measured: str = NOT_MEASURED, status: str = SWITCH) -> Finding:
    """One switch the loop could take: what was seen, its saving (or why none was measured), the ablation."""
    name = f"{what} (--switches {rung})"
    refusal = (obs.observed or {}).get("refusal")
    if model_level and refusal:
        return Finding(name, "switch", NOT_HERE, f"{seen}; but no model switch can reach this loop: {refusal}")
    share = cost_s / obs.step_s if cost_s is not None and obs.step_s else None
    return Finding(name, "switch", status, f"{seen}; {measured}", cost_s, share, ablate(obs, rung))


def amp(obs: Observations) -> Finding | None:
    seen = obs.observed
    if not seen or seen.get("precision") not in ("fp32", None) or seen.get("autocast") or seen.get("optimizer") is None:
        return None
    roof = ""
    if obs.half_ceiling and obs.ceiling_flops:
        half, peak = obs.half_ceiling
        roof = (f" (this machine's measured {half} matmul peak is {peak / obs.ceiling_flops:.1f}x its fp32 one: a "
                "roof, not the loop's saving)")
    return candidate(obs, "amp", "mixed precision around the training forward",
                     "the training forward runs in fp32, no autocast" + roof)


def compile_model(obs: Observations) -> Finding | None:
    seen = obs.observed
    if not seen or seen.get("compiled") or seen.get("optimizer") is None:
        return None
    return candidate(obs, "compile", "torch.compile of the trained model", "the trained model runs eagerly")


def fused(obs: Observations) -> Finding | None:
    seen = obs.observed
    impl = (seen or {}).get("optimizer_implementation")
    if not seen or impl in (None, "fused"):
        return None
    return candidate(obs, "fused", "the optimizer's fused implementation",
                     f"{seen.get('optimizer')} runs its {impl} implementation (a class with no fused form is said so "
                     "by the ablation)")


def workers(obs: Observations) -> Finding | None:
    loader = (obs.observed or {}).get("loader")
    if not loader or loader.get("num_workers"):
        return None
    seen = "the training DataLoader builds each batch in this process (num_workers=0)"
    if obs.cuda and not loader.get("pin_memory"):
        seen += ", into unpinned memory (pin_memory=False)"
    if obs.wait_s is None or not obs.step_s:
        return candidate(obs, "workers", "loader worker processes", seen, model_level=False)
    wait = f"the loop waits {ms(obs.wait_s)} a step ({pct(obs.wait_share or 0.0)}) for its next batch (measured)"
    if workers_cannot_pay(obs):          # a number to know, not a switch to try
        return candidate(obs, "workers", "loader worker processes", seen, False, 0.0,
                         f"{wait}, less than the {ms(obs.handoff_s)} a worker adds to hand a batch over (measured): "
                         "workers cannot win it back", status="measured")
    return candidate(obs, "workers", "loader worker processes", seen, False, obs.wait_s,
                     f"{wait}: workers save at most that")


def channels_last(obs: Observations) -> Finding | None:
    seen = obs.observed
    if not seen or seen.get("memory_format") != "contiguous" or seen.get("optimizer") is None:
        return None
    return candidate(obs, "channels_last", "channels_last memory format", "the model's conv weights are NCHW "
                     "(contiguous)")


SWITCH_CHECKS = (amp, compile_model, fused, workers, channels_last)
