"""`trainfast tune`: the fastest recipe for this model, data and machine that keeps accuracy.

Switches interact (channels_last pays in bf16 and not in fp32; compile pays only on a long enough run; O2
beats O1 on some models), so the top of a cumulative ladder is not always the best recipe. The search, in
stages of the ablation's own run loop (ablation.run_ladder: interleaved repeats in fresh processes,
pooled-noise intervals, firm verdicts), each stage a folder of its own so an interrupted search resumes:

  1. singles/  every switch alone against the baseline: the precision levels (O1 and O2 in the device's
     fast half type), set_to_none, prefetch, channels_last, compile, fused, passive_threads, reuse_memory,
     and for an image folder the decode cache.
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
dropped.

  3. input/    when the recommended recipe's runs waited for their batches a fifth of each step or more: the
     input switches (decoding on the device, the decode cache, more loader workers) on top of it, each
     against it; what gains most joins the recipe, and while it is still held by its input the rest are
     tried again on top (input-2/, ...). Judged alone in fp32 (stage 1) they show nothing where the fp32
     step is slower than the input: they pay only once the step outruns it.

  4. to-target/ with --target: the baseline, the recipe found so far and that recipe at half, twice and four
     times its batch (the learning rate and warm-up following it), side by side, each run trained to the target
     and judged on its time to it (ablation/target.py); the soonest candidate firmly sooner than the baseline,
     and measurably sooner than the rate pick, is recommended (else the rate pick stands). The stages before it
     keep to half the budget (tune/target.py: TARGET_SHARE).

Output: best.yaml (a recipe file `trainfast train --recipe best.yaml` takes as is), tune.md, tune.json.

  options.py   TuneOptions: what tune() takes beside the work, checked before any work starts
  budget.py    SearchBudget, the one clock every stage is priced by; the stages' shares; parse_budget
  switches.py  the switches tried, their priority, stage 1's plan, what a stage-1 rung says about a switch
  combine.py   the combination, stage 2's rungs and the recommendation (Decision)
  inputs.py    stage 3: the input switches on a recipe held by its input
  target.py    stage 4: the candidates on their time to target (--target)
  batch.py     --batch-size-search: larger batches, reported apart
  search.py    tune(): the stages, sharing a Search (the work, the options, the notes)
  outputs.py   best.yaml, tune.json, tune.md
"""
from .batch import BATCH_FACTORS, batch_finding, batch_rungs
from .budget import SETTLE_SHARE, SINGLES_SHARE, SearchBudget, parse_budget, singles_share
from .combine import Decision, break_even_steps, combine, combine_stage, decide, on_level_decision
from .options import TuneOptions
from .outputs import write_outputs
from .search import tune
from .switches import PRECISION_FIELDS, PRIORITY, firm_gain, kept_level, on_level_order, single_names

__all__ = ["tune", "TuneOptions", "Decision", "SearchBudget", "parse_budget", "combine", "combine_stage", "decide",
           "break_even_steps", "batch_rungs", "batch_finding", "single_names", "on_level_order", "singles_share",
           "kept_level", "firm_gain", "on_level_decision", "write_outputs", "PRIORITY", "PRECISION_FIELDS",
           "SINGLES_SHARE", "SETTLE_SHARE", "BATCH_FACTORS"]
