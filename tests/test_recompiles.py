"""Compile on batches of varying length: a run's recompiles counted and reported, and pad_to_multiple, which rounds
a language model's padded batches up so a compiled model sees few lengths. Compiled with backend="eager" (dynamo's
tracing and guards, no code generation): recompiles are dynamo's, so the count is the same, in a fraction of the
time."""
from __future__ import annotations

import pytest
import torch
from torch import nn

from conftest import scored_rung
from trainfast.ablation.scoring import score_rungs
from trainfast.instruments.recompiles import CompileWindow, describe, is_recompile
from trainfast.report.notes import caveats

VOCAB = 50


def tiny_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Embedding(VOCAB, 8), nn.Linear(8, 8))


def run_lengths(compiled, lengths: list[int]) -> None:
    for length in lengths:
        compiled(torch.randint(0, VOCAB, (2, length))).sum().backward()


@pytest.fixture
def fresh_dynamo():
    import torch._dynamo

    torch._dynamo.reset()
    yield
    torch._dynamo.reset()


def test_one_length_compiles_once_and_never_recompiles(fresh_dynamo):
    compiled = torch.compile(tiny_model(), backend="eager")
    window = CompileWindow().open()
    run_lengths(compiled, [5, 5, 5])
    same = window.read()
    window.close()
    assert same["compiles"] == 1 and same["recompiles"] == 0 and same["limit_hits"] == 0, same
    assert describe(same).endswith("no recompiles")


def test_three_lengths_recompile_and_the_next_window_starts_at_zero(fresh_dynamo):
    compiled = torch.compile(tiny_model(), backend="eager")
    window = CompileWindow().open()
    run_lengths(compiled, [6, 9, 1])         # static, then the length marked dynamic, then 1 specialised
    varied = window.read()
    window.close()
    assert varied["recompiles"] > 0 and varied["compiles"] >= 2 and varied["unseen"] == 0, varied
    assert "recompiles for new input shapes" in describe(varied)

    window = CompileWindow().open()            # a second run's window counts from its own start
    run_lengths(compiled, [7, 8])              # lengths the dynamic graph already covers
    again = window.read()
    window.close()
    assert again["compiles"] == 0 and again["recompiles"] == 0 and describe(again) is None, again


def test_the_recompile_limit_hit_is_counted_and_said(fresh_dynamo):
    import torch._dynamo.config

    # every length its own graph, and room for two
    with torch._dynamo.config.patch(recompile_limit=2, automatic_dynamic_shapes=False):
        compiled = torch.compile(tiny_model(), backend="eager")
        window = CompileWindow().open()
        run_lengths(compiled, [3, 4, 5, 6])
        counts = window.read()
    window.close()
    assert counts["limit_hits"] >= 1 and counts["recompile_limit"] == 2, counts
    assert "ran eagerly" in describe(counts)


def test_compile_ids():
    assert not is_recompile("0/0") and is_recompile("0/1") and is_recompile("!2/3") and is_recompile("1/2_1")
    assert not is_recompile("garbled")


def test_a_compiled_rung_says_its_recompiles_in_the_notes():
    rungs = [scored_rung("baseline", [100, 101], 0.9), scored_rung("compile", [120, 121], 0.9, compile=True)]
    counts = {"compiles": 5, "graphs": 5, "recompiles": 4, "limit_hits": 1, "unseen": 0, "recompile_limit": 8}
    rungs[1].repeats[0]["compile"] = {"graphs": 5, "run": counts}
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    said = " ".join(caveats(rungs[1]))
    assert "4 of them recompiles" in said and "recompile limit (8) was hit 1 time(s)" in said, said
    assert not any("compile:" in note for note in caveats(rungs[0]))


def test_every_run_record_carries_its_own_compiles(fresh_dynamo):
    from trainfast.probe import MeasureSpec, Probe, compile_counters

    compiled = torch.compile(tiny_model(), backend="eager")
    run_lengths(compiled, [4])                 # before the run: not its compile
    probe = Probe(MeasureSpec("", "full"))     # what the built-in run and a Session script's run both make
    run_lengths(compiled, [4, 4, 1])
    counts = compile_counters(probe.compiles)
    probe.compiles.close()
    assert counts["run"]["compiles"] == counts["recompiles"] == 1 and counts["recompile_limit_hit"] is False, counts


# --- a recompile inside the timed steps ---------------------------------------------------------------------------
def test_each_compile_is_placed_in_the_step_it_happened_in(fresh_dynamo):
    compiled = torch.compile(tiny_model(), backend="eager")
    step = [0]
    window = CompileWindow(lambda: step[0]).open()
    for length in (6, 6, 9, 9, 9):             # step 2: a new length, compiled again (dynamic)
        run_lengths(compiled, [length])
        step[0] += 1
    window.close()
    assert window.steps[0] == 0 and 2 in window.steps and set(window.steps) <= {0, 2}, window.steps


def fake_steps(seconds: list[float], samples: int = 10):
    from trainfast.measure.clock import StepTime

    return [StepTime(s, samples, 0.0) for s in seconds]


def test_a_recompile_in_the_timed_steps_is_left_out_as_warm_up():
    from trainfast.measure import Timing

    seconds = [2.0] + [0.1] * 11 + [5.0, 0.4] + [0.1] * 16    # warm-up, then a recompile at step 12 and its tail
    plain = Timing.from_steps(fake_steps(seconds))
    timing = Timing.from_steps(fake_steps(seconds), compiles=[0, 12])
    assert timing.warmup_steps == 1 and plain.warmup_steps == 1
    assert [(c["step"], c["steps"]) for c in timing.compiled] == [(12, 2)]
    assert timing.compiled[0]["seconds"] == pytest.approx(5.4)
    assert timing.throughput == pytest.approx(100.0)            # 10 samples a 0.1 s step: the steady rate
    assert plain.throughput < 60                                # the recompile's 5.4 s counted as rate
    record = timing.to_dict()
    assert record["compiled_left_out"] == timing.compiled and record["disturbed_steps"] == 0
    assert record["timed_steps"] == 27


def test_a_compile_in_a_step_that_is_not_slow_leaves_nothing_out():
    from trainfast.measure import Timing

    # a compile during an evaluation is placed in the next step, which it did not slow
    timing = Timing.from_steps(fake_steps([2.0] + [0.1] * 20), compiles=[8])
    assert timing.compiled == [] and timing.clean_steps == 20


def test_the_recompile_left_out_is_said_in_the_notes():
    rungs = [scored_rung("baseline", [100, 101], 0.9), scored_rung("compile", [120, 121], 0.9, compile=True)]
    rungs[1].repeats[1]["timing"]["compiled_left_out"] = [{"step": 12, "steps": 2, "seconds": 5.4}]
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    said = " ".join(caveats(rungs[1]))
    assert "seed 1: recompiled at step 12: steps 12..13 left out of the rate as warm-up (5.4 s" in said, said
    assert not any("recompiled at" in note for note in caveats(rungs[0]))


def test_a_step_holding_an_evaluation_is_left_out_of_the_training_rate():
    from trainfast.measure import Timing

    seconds = [2.0] + [0.1] * 7 + [1.2] + [0.1] * 7 + [1.2] + [0.1] * 7    # an evaluation every 8 steps
    plain = Timing.from_steps(fake_steps(seconds))
    timing = Timing.from_steps(fake_steps(seconds), other_passes=[8, 16, 30])       # 30: past the run's end
    assert [e["step"] for e in timing.evaluated] == [8, 16] and timing.evaluated[0]["seconds"] == 1.2
    assert timing.throughput == pytest.approx(100.0) and plain.throughput < 70
    record = timing.to_dict()
    assert record["evaluation_left_out"] == timing.evaluated and record["disturbed_steps"] == 0
    assert record["timed_steps"] == 21
    # a loop that iterates another loader in every step: that is its training, nothing is left out
    every = Timing.from_steps(fake_steps([2.0] + [0.1] * 6), other_passes=list(range(7)))
    assert every.evaluated == [] and every.clean_steps == 6


def test_a_scripts_evaluation_between_steps_is_placed_in_its_step_and_said():
    """A plain loop that evaluates on its own loader after every epoch, under the probe in this process: the steps
    in which the validation pass began are left out of the rate, and the rung's notes say so."""
    import time

    from torch.optim.optimizer import register_optimizer_step_post_hook

    from trainfast.probe import MeasureSpec, Probe
    from trainfast.probe.observe import Observer

    probe = Probe(MeasureSpec("", "full"))
    probe.observer = Observer().install()
    probe.observer.loader_listeners.append(probe.other_passes)
    hook = register_optimizer_step_post_hook(probe._global_step)
    try:
        model = nn.Linear(4, 2)
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        data = torch.utils.data.TensorDataset(torch.randn(32, 4), torch.randint(0, 2, (32,)))
        train = torch.utils.data.DataLoader(data, batch_size=4)
        val = torch.utils.data.DataLoader(data, batch_size=16)
        for _ in range(3):
            for x, y in train:
                if probe.timer is None:
                    probe.training_began(model)          # the first training forward (BatchKind's on_start)
                nn.functional.cross_entropy(model(x), y).backward()
                time.sleep(0.05)        # a steady step: a tiny model's step alone jitters past the warm-up's tolerance
                optimizer.step()        # on a busy machine, and its warm-up would then swallow the first evaluation
                optimizer.zero_grad()
            with torch.no_grad():
                for x, _ in val:
                    model(x)
                    time.sleep(0.05)
        timing = probe.timing()
    finally:
        hook.remove()
        probe.observer.close()
        probe.compiles.close()
    assert probe.other_passes.steps == [8, 16, 24]
    assert [e["step"] for e in timing.evaluated] == [8, 16]     # the third began after the last step
    assert all(e["seconds"] >= 0.1 for e in timing.evaluated)
    rungs = [scored_rung("baseline", [100, 101], 0.9)]
    rungs[0].repeats[0]["timing"]["evaluation_left_out"] = timing.evaluated
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    said = " ".join(caveats(rungs[0]))
    assert "2 timed step(s) in 1 of 2 run(s) held a pass over another loader than the training one" in said, said


def timed_record(seconds: list[float], compiles: list[int]) -> dict:
    """A run's record as the ablation reads it back: its timing from these step times and compile steps."""
    from trainfast.measure import Timing

    return {"seed": 0, "timing": Timing.from_steps(fake_steps(seconds), compiles=compiles).to_dict()}


# a whole run of 10 timed steps whose recompile at step 4 and its tail take 3 of them: 7 left for the rate
SHORT = [2.0] + [0.1] * 3 + [5.0, 0.4, 0.3] + [0.1] * 4
ENOUGH = [2.0] + [0.1] * 11 + [5.0, 0.4] + [0.1] * 16


def test_a_recompile_that_leaves_too_few_timed_steps_asks_for_a_repeat():
    from trainfast.ablation.recompiled import MIN_KEPT, short_of_steps

    short = short_of_steps(timed_record(SHORT, [0, 4]))
    assert short == {"step": 4, "steps": 3, "seconds": pytest.approx(5.7), "timed_steps": 10, "kept_steps": 7}, short
    assert short["kept_steps"] < MIN_KEPT
    assert short_of_steps(timed_record(ENOUGH, [0, 12])) is None          # 25 of 27 kept: left out is enough
    assert short_of_steps(timed_record(SHORT, [0])) is None               # no recompile past warm-up
    assert short_of_steps({"error": "it failed"}) is None


def plain_display(rungs):
    import io

    from rich.console import Console

    from trainfast.report import Display

    out = io.StringIO()
    display = Display(rungs, {}, {"device_name": "cpu", "device": "cpu"}, console=Console(file=out, width=200))
    display.plan(["compile", "baseline"])
    return display, out


def test_the_run_is_repeated_once_and_the_console_and_notes_say_so(tmp_path):
    from trainfast.ablation.recompiled import run_repeating

    rungs = [scored_rung("baseline", [100, 101], 0.9), scored_rung("compile", [120, 121], 0.9, compile=True)]
    display, out = plain_display(rungs)
    launched = []
    records = iter([timed_record(SHORT, [0, 4]), timed_record(ENOUGH, [0])])
    result, _ = run_repeating(lambda folder: launched.append(folder) or next(records), tmp_path, display, "compile")
    assert launched == [tmp_path, tmp_path / "repeat"]
    assert result["recompiled"]["measurement"] is True and result["timing"]["compiled_left_out"] == []
    said = out.getvalue()
    assert "plan: +1 run(s), recompiled at step 4: run repeated (" in said and "now 3 runs" in said, said
    assert display.runs.done == 1 and display.runs.planned == ["compile", "baseline"]
    rungs[1].repeats[0] = {**rungs[1].repeats[0], **result, "timing": rungs[1].repeats[0]["timing"]}
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    assert any("seed 0: recompiled at step 4: run repeated" in note for note in caveats(rungs[1]))
    assert not any("not a measurement" in note for note in caveats(rungs[1]))


def test_a_second_recompile_in_the_repeat_is_said_and_not_a_measurement(tmp_path):
    from trainfast.ablation.recompiled import run_repeating
    from trainfast.report.table import Columns, table_rows

    rungs = [scored_rung("baseline", [100, 101], 0.9), scored_rung("compile", [120, 121], 0.9, compile=True)]
    display, out = plain_display(rungs)
    records = iter([timed_record(SHORT, [0, 4]), timed_record(SHORT, [0, 4])])
    result, _ = run_repeating(lambda folder: next(records), tmp_path, display, "compile")
    assert result["recompiled"]["measurement"] is False
    assert "recompiled again at step 4 in the repeat" in out.getvalue() and "not a measurement" in out.getvalue()
    rungs[1].repeats[1] = {**rungs[1].repeats[1], "recompiled": result["recompiled"]}
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    assert any("recompiled again at step 4 in the repeat" in note for note in caveats(rungs[1]))
    rows = table_rows(rungs, Columns())
    assert rows[1][3].startswith("not a measurement") and not rows[0][3].startswith("not a measurement"), rows


def test_no_repeat_past_the_time_budget_and_the_rate_is_not_a_measurement(tmp_path):
    from trainfast.ablation.recompiled import run_repeating

    rungs = [scored_rung("baseline", [100, 101], 0.9), scored_rung("compile", [120, 121], 0.9, compile=True)]
    display, out = plain_display(rungs)
    launched = []
    result, _ = run_repeating(lambda folder: launched.append(folder) or timed_record(SHORT, [0, 4]), tmp_path,
                              display, "compile", fits=lambda seconds: False, name="compile, seed 0")
    assert launched == [tmp_path] and result["recompiled"]["measurement"] is False      # launched once
    assert ("compile, seed 0: recompiled at step 4 (7 of 10 timed steps left) and not measured again (no time left "
            "for it in the budget): its rate is not a measurement") in out.getvalue(), out.getvalue()
    assert "plan: +1" not in out.getvalue()
    rungs[1].repeats[0] = {**rungs[1].repeats[0], "recompiled": result["recompiled"]}
    score_rungs(rungs, {"fp32": 1e12}, [0.9, 0.9])
    said = " ".join(caveats(rungs[1]))
    assert "seed 0: recompiled at step 4 (7 of 10 timed steps left) and not measured again" in said, said


def test_a_recompile_left_out_is_said_on_the_console_as_the_run_ends(tmp_path):
    from trainfast.ablation.recompiled import run_repeating

    display, out = plain_display([scored_rung("baseline", [100, 101], 0.9)])
    launched = []
    result, _ = run_repeating(lambda folder: launched.append(folder) or timed_record(ENOUGH, [0, 12]), tmp_path,
                              display, "compile", name="compile, seed 0")
    assert launched == [tmp_path] and "recompiled" not in result               # left out was enough: run once
    assert ("compile, seed 0: recompiled at step 12: steps 12..13 left out of the rate as warm-up (5.4 s of "
            "compilation, not the switch's rate)") in out.getvalue(), out.getvalue()


def test_a_repeat_fits_where_a_run_as_long_as_the_first_and_the_close_fit():
    from types import SimpleNamespace

    from trainfast.ablation.clock import RunClock
    from trainfast.ablation.spending import LadderSpending

    now = [0.0]
    spending = LadderSpending(SimpleNamespace(clock=RunClock(now=lambda: now[0]), time_budget_s=100.0, target=None),
                              "speed")
    now[0], spending.close_s = 50.0, 10.0          # 50 s left, 10 of them kept for the ladder's close
    assert spending.fits_s(39.0) and not spending.fits_s(41.0)


# --- pad_to_multiple ----------------------------------------------------------------------------------------------
def documents(lengths: list[int]) -> list[torch.Tensor]:
    generator = torch.Generator().manual_seed(0)
    return [torch.randint(2, VOCAB, (n,), generator=generator) for n in lengths]


def test_pad_to_multiple_rounds_the_length_and_masks_the_rest():
    from trainfast.text.batching import IGNORE, PadCollate

    docs = documents([5, 70, 33])
    inputs, labels = PadCollate(0, multiple=64)(docs)
    assert inputs["input_ids"].shape == (3, 128) and labels.shape == (3, 128)
    for row, doc in enumerate(docs):
        n = len(doc)
        assert torch.equal(inputs["input_ids"][row, :n], doc) and (inputs["input_ids"][row, n:] == 0).all()
        assert inputs["attention_mask"][row, :n].all() and not inputs["attention_mask"][row, n:].any()
        assert torch.equal(labels[row, :n], doc) and (labels[row, n:] == IGNORE).all()
    # the rate counts the real tokens, never the padding
    assert inputs.rate_count == 108 and inputs.slots == 3 * 128
    assert PadCollate(0, multiple=64)(documents([64, 10]))[0]["input_ids"].shape[1] == 64   # already a multiple
    assert PadCollate(0)(docs)[0]["input_ids"].shape[1] == 70                            # off: the longest's


def test_the_padded_to_multiple_loss_is_the_unpadded_loss():
    pytest.importorskip("transformers")
    from trainfast.text.batching import PadCollate
    from trainfast.text.models import build_lm

    torch.manual_seed(0)
    model = build_lm("llama-tiny", VOCAB, 128, 0, 1).eval()
    docs = documents([7, 30, 19, 41])
    plain, rounded = PadCollate(0)(docs), PadCollate(0, multiple=64)(docs)
    assert rounded[0]["input_ids"].shape[1] == 64 != plain[0]["input_ids"].shape[1]
    with torch.no_grad():
        loss_plain = model(**plain[0], labels=plain[1]).loss
        loss_rounded = model(**rounded[0], labels=rounded[1]).loss
    assert abs(loss_plain.item() - loss_rounded.item()) < 1e-4      # masked positions change nothing but fp sums


def test_pad_multiple_is_an_lm_rung_outside_the_default_ladders():
    from trainfast.recipe import Recipe, RecipeError
    from trainfast.techniques import default_ladder, rung_table
    from trainfast.techniques import TrainBatches, asked_batches, collate_batches
    from trainfast.text.batching import PackCollate, PadCollate

    def collate_for(recipe, pad_id):          # the built-in run's collate function, from the batch switches
        return collate_batches(TrainBatches(PadCollate(pad_id)), asked_batches(recipe))

    assert rung_table("lm")["pad_multiple"] == {"pad_to_multiple": 64}
    assert "pad_multiple" not in rung_table("classification") and "pad_multiple" not in rung_table("detection")
    assert "pad_multiple" not in default_ladder("lm")
    assert collate_for(Recipe(pad_to_multiple=64), 0) == PadCollate(0, 64)
    assert isinstance(collate_for(Recipe(pad_to_multiple=64, padding_free=True), 0), PackCollate)
    with pytest.raises(RecipeError, match="pad_to_multiple"):
        Recipe(pad_to_multiple=-8)


def test_a_trainer_collator_is_rounded_through_its_own_setting():
    from trainfast.frameworks.board import FrameworkRecord
    from trainfast.frameworks.packing import switch_collate
    from trainfast.techniques import TrainBatches

    class Collator:                        # what transformers' padding collators hold
        pad_to_multiple_of = None

    record, collator = FrameworkRecord("transformers", "test"), Collator()
    switch_collate(record, TrainBatches(collator, collate_name="data_collator"), {"pad_to_multiple": 64}, False)
    assert collator.pad_to_multiple_of == 64
    assert record.switches["data_collator.pad_to_multiple_of"].applied
    bare = FrameworkRecord("transformers", "test")
    switch_collate(bare, TrainBatches(object(), collate_name="data_collator"), {"pad_to_multiple": 64}, False)
    assert "no pad_to_multiple_of" in bare.unsupported["pad_to_multiple"]
