"""A script's task, read from its first training forward (instruments/batches.py), picks its ladder: a language
model's batches get the language-model switches, an image model's the image ladder, without the user naming
either; --task names it outright; the report says which task and from what."""
from __future__ import annotations

import dataclasses

import pytest
import torch
import torchvision
from torch import nn

from trainfast.instruments.batches import BatchKind, kind_of


class TinyLM(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(50, 8)
        self.head = nn.Linear(8, 50)

    def forward(self, input_ids: torch.Tensor) -> torch.Tensor:
        return self.head(self.embed(input_ids))


def watched(model: nn.Module, *args, train: bool = True, grad: bool = True) -> dict:
    kind = BatchKind()
    try:
        model.train(train)
        with torch.set_grad_enabled(grad):
            model(*args)
    finally:
        kind.close()
    return kind.to_dict()


def test_token_ids_into_an_embedding_are_a_language_models_batches():
    seen = watched(TinyLM(), torch.randint(0, 50, (4, 12)))
    assert seen["kind"] == "tokens" and seen["task"] == "lm"
    assert "embedding" in seen["seen"] and "4x12 int64 token ids" in seen["seen"]


def test_images_into_a_convolution_are_an_image_models_batches():
    model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(10))
    seen = watched(model, torch.randn(2, 3, 8, 8))
    assert seen["kind"] == "images" and seen["task"] == "classification" and "2x3x8x8 float32" in seen["seen"]


def test_a_detectors_images_and_targets_are_detection():
    model = torchvision.models.detection.fasterrcnn_mobilenet_v3_large_fpn(weights=None, weights_backbone=None,
                                                                          num_classes=3)
    images = [torch.rand(3, 64, 80), torch.rand(3, 72, 64)]
    targets = [{"boxes": torch.tensor([[1.0, 2.0, 30.0, 40.0]]), "labels": torch.tensor([1])} for _ in images]
    seen = watched(model, images, targets)
    assert seen["kind"] == "detection" and seen["task"] == "detection" and "2 images" in seen["seen"]


def test_evaluation_and_no_grad_forwards_say_nothing_and_the_hook_goes_once_answered():
    assert watched(TinyLM(), torch.randint(0, 50, (2, 3)), train=False)["kind"] is None
    assert watched(TinyLM(), torch.randint(0, 50, (2, 3)), grad=False)["kind"] is None
    kind = BatchKind()
    TinyLM().train()(torch.randint(0, 50, (2, 3)))
    assert kind.kind == "tokens" and kind.handle is None            # removed: no hook left on later steps
    assert kind_of(nn.Linear(3, 3), (torch.randn(2, 3),)) is None     # a linear layer's input tells nothing
    silent = BatchKind()                           # a model that never tells: watched for its first step only
    nn.Linear(3, 3).train()(torch.randn(2, 3))
    silent.step()
    assert silent.kind is None and silent.handle is None


def faked_ladder(tmp_path, batches: dict | None, task: str | None = None, named: list[str] | None = None):
    """A command's default ladder run with a fake launch whose script has a Session and whose baseline's probe saw
    `batches`: the plan as ablate_command makes it (api.py), the runs launched, the result."""
    from conftest import scored_rung
    from test_fw_proof import command_work

    from trainfast.ablation.ladders import SCRIPT, plan_rungs
    from trainfast.ablation.loop import LadderOptions, run_ladder
    from trainfast.tasks import TASKS

    work0 = command_work()
    plan = plan_rungs(work0.base, named, "cumulative", "bf16", work0.dev, task if task and not named else SCRIPT)
    by_task = {} if named or task else {name: plan_rungs(work0.base, None, "cumulative", "bf16", work0.dev, name)
                                        for name in TASKS if name != "classification"}
    template = scored_rung("x", [500.0], 0.95).repeats[0]
    launched = []

    class Fake(type(work0)):
        def launcher(self, measure):
            def launch(rung, recipe, budget, run_dir, display, limit):
                launched.append(rung.name)
                return {**template, "seed": recipe.seed, "session": True, "batches": batches}
            return launch

    work = Fake(**{f.name: getattr(work0, f.name) for f in dataclasses.fields(work0)})
    work.by_task, work.task = by_task, (task if not named else None)
    options = LadderOptions(repeats=2, noise_seeds=2, show=False, settle_within_s=0)
    settings = {"repeats": 2, "budget": dataclasses.asdict(work.budget), "min_effect": 0.05}
    result = run_ladder(plan, work, settings, tmp_path / "run", options)
    return result, launched


LM_SEEN = {"kind": "tokens", "task": "lm", "seen": "an embedding (Embedding) given 16x212 int64 token ids"}


def test_a_language_models_batches_replace_the_default_ladder_with_its_own(tmp_path):
    from trainfast.ablation.ladders import LADDERS

    result, launched = faked_ladder(tmp_path, LM_SEEN)
    names = [r.name for r in result.rungs]
    assert names == list(LADDERS["lm"][0])                       # baseline, amp, padding_free, group_by_length, ...
    assert "channels_last" not in launched and "prefetch" not in launched
    assert launched[0] == "baseline" and "padding_free" in launched and launched.count("padding_free") == 2
    padding_free = next(r for r in result.rungs if r.name == "padding_free")
    assert padding_free.recipe.padding_free and padding_free.recipe.precision == "bf16"   # cumulative on amp
    assert result.settings["script_task"]["name"] == "lm"
    report = (result.out_dir / "report.md").read_text()
    assert "a language model (token ids in its batches) (`lm`), read from its first training forward: an " \
           "embedding (Embedding) given 16x212 int64 token ids; its own ladder replaced the default one" in report


def test_an_image_models_batches_keep_the_default_ladder(tmp_path):
    from trainfast.ablation.ladders import LADDERS

    seen = {"kind": "images", "task": "classification", "seen": "a convolution (Conv2d) given 8x3x32x32 images"}
    result, launched = faked_ladder(tmp_path, seen)
    assert [r.name for r in result.rungs] == list(LADDERS["script"][0])
    assert "read from its first training forward" in (result.out_dir / "report.md").read_text()


@pytest.mark.parametrize("how", ["named", "task"])
def test_named_rungs_or_a_given_task_are_never_replaced(tmp_path, how):
    kwargs = {"named": ["amp", "channels_last"]} if how == "named" else {"task": "lm"}
    result, launched = faked_ladder(tmp_path, LM_SEEN, **kwargs)
    names = [r.name for r in result.rungs]
    if how == "named":
        assert names == ["baseline", "amp", "channels_last"]
    else:
        assert "padding_free" in names and result.settings["script_task"] == {"name": "lm", "from": "--task"}


def test_a_script_whose_batches_said_nothing_keeps_its_ladder(tmp_path):
    from trainfast.ablation.ladders import LADDERS

    result, _ = faked_ladder(tmp_path, {"kind": None, "task": None, "seen": ""})
    assert [r.name for r in result.rungs] == list(LADDERS["script"][0]) and "script_task" not in result.settings


@pytest.mark.slow
def test_an_unmodified_trainer_script_gets_the_language_model_ladder_without_being_told(tmp_path):
    """examples/hf_causal_lm.py (transformers' Trainer, never imports trainfast), `ablate -- COMMAND` with no
    --switches and no --task: its baseline's first forward shows token ids, so the language-model ladder runs (amp,
    padding_free, group_by_length, the attention backends, fused), each switch read back through the Trainer
    (packing and length grouping checked here; the attention backend's read-back: test_lm)."""
    import os
    import sys

    from trainfast.ablation import ablate_command
    from trainfast.ablation.ladders import LADDERS
    from trainfast.results import Status

    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    result = ablate_command([sys.executable, os.path.join(root, "examples", "hf_causal_lm.py"), "--documents", "96",
                             # documents cut at 64 tokens, not 256: each of the ladder's runs in about half the CPU
                             # time, its batches still padded (what packing and length grouping act on)
                             "--max-length", "64", "--out", str(tmp_path / "trainer")], device="cpu",
                            out=tmp_path / "ablation", repeats=1, noise_seeds=1, show=False, settle_within_s=0,
                            amp_dtype="bf16")
    assert [r.name for r in result.rungs] == list(LADDERS["lm"][0])
    assert result.settings["script_task"]["name"] == "lm" and "token ids" in result.settings["script_task"]["from"]
    rungs = {r.name: r for r in result.rungs}
    assert rungs["padding_free"].status == Status.DONE, (rungs["padding_free"].status, rungs["padding_free"].reason)
    switches = rungs["padding_free"].repeats[0]["frameworks"]["transformers"]["switches"]
    assert switches["data_collator packs"]["applied"]
    grouped = rungs["group_by_length"].repeats[0]["frameworks"]["transformers"]["switches"]["train_sampling_strategy"]
    assert grouped["applied"] and grouped["read_back"] == "group_by_length", grouped
    assert "read from its first training forward" in (result.out_dir / "report.md").read_text()


def test_a_token_scripts_count_is_the_same_padded_or_packed_prompt_masks_included():
    """The unit of a token script's rate: the tokens its loss predicts, which packing leaves as they were (a packed
    document's first label is IGNORE, a padded row's first position is never predicted): the same documents
    count the same either way, so packing's rate and its wall time tell the same story."""
    from trainfast.instruments.batches import IGNORE, tokens_in
    from trainfast.text.batching import PadCollate, pack

    torch.manual_seed(0)
    docs = [torch.randint(1, 50, (n,)) for n in (5, 3, 9, 2)]
    padded, labels = PadCollate(0)(docs)
    packed, packed_labels = pack(docs, docs, 0)
    as_padded = int(tokens_in((), {**padded, "labels": labels}))
    assert as_padded == sum(len(d) for d in docs) - len(docs)          # every token but each document's first
    assert int(tokens_in((), {**packed, "labels": packed_labels})) == as_padded
    # a fine-tuning script's labels: the first two tokens of each document (its prompt) not predicted
    masked = [torch.cat([torch.full((2,), IGNORE), d[2:]]) for d in docs]
    padded_masked = labels.clone()
    for row, target in enumerate(masked):
        padded_masked[row, :len(target)] = target
    _, packed_masked = pack(docs, masked, 0)
    assert int(tokens_in((), {**padded, "labels": padded_masked})) \
        == int(tokens_in((), {**packed, "labels": packed_masked})) == sum(max(0, len(d) - 2) for d in docs)
    # without labels: the attention mask; a mapping as the first argument (a LightningModule's self(batch)) too
    assert int(tokens_in(({"input_ids": padded["input_ids"], "attention_mask": padded["attention_mask"]},), {})) \
        == sum(len(d) for d in docs)
    assert tokens_in((torch.randn(2, 3),), {}) is None


class LabelledLM(TinyLM):
    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor | None = None) -> torch.Tensor:
        logits = super().forward(input_ids)
        return logits if labels is None else nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1),
                                                                         labels[:, 1:].flatten(), ignore_index=-100)


def test_a_token_scripts_steps_are_counted_in_tokens_on_the_device_and_read_once():
    model = LabelledLM()
    kind = BatchKind()
    try:
        for step in range(3):
            for micro in range(2):                     # gradient accumulation: two forwards a step
                ids = torch.randint(1, 50, (2, 6))
                labels = ids.masked_fill(torch.arange(6) >= 4 + step, -100)   # rows of 4, 5, 6 real tokens
                model(input_ids=ids, labels=labels)
            kind.step()
        with torch.no_grad():                          # evaluation is never counted
            model.eval()(input_ids=ids, labels=labels)
    finally:
        kind.close()
    # the first forward told the kind (counting began after it): its step has one micro-batch counted
    assert kind.kind == "tokens" and kind.step_tokens(3) == [2 * 3, 2 * 2 * 4, 2 * 2 * 5]
    assert kind.step_tokens(5) == [0, 0, 6, 16, 20]


def test_tune_on_a_script_plans_each_tasks_stage_1_and_follows_the_batches(tmp_path):
    """`tune -- COMMAND` with no --task: stage 1 is planned for the default task and for each other one; the
    first run's batches (token ids) swap in the language model's switches (packing and grouping first), and a
    re-plan of stage 1 keeps to that task."""
    import sys

    from trainfast.ablation.work import BuiltinSpec
    from trainfast.tune.budget import SearchBudget
    from trainfast.tune.options import tune_options
    from trainfast.tune.search import prepare_search

    opts = tune_options({"command": [sys.executable, "-c", "pass"], "out": tmp_path / "tune", "amp_dtype": "bf16",
                         "show": False})
    search, singles = prepare_search(BuiltinSpec(), None, "cpu", opts, SearchBudget(600))
    assert "channels_last" in [r.name for r in singles] and "padding_free" not in [r.name for r in singles]
    lm = [r.name for r in search.work.by_task["lm"]]
    assert lm[0] == "baseline" and lm.index("padding_free") < lm.index("group_by_length") < lm.index("fused")
    search.work.follow_task(singles, {"batches": LM_SEEN})
    assert [r.name for r in singles] == lm and search.work.learned["script_task"]["name"] == "lm"
    assert [r.name for r in search.replan()] == lm
    given, _ = prepare_search(BuiltinSpec(task="lm"), None, "cpu", tune_options(
        {"command": [sys.executable, "-c", "pass"], "out": tmp_path / "given", "amp_dtype": "bf16", "show": False}),
        SearchBudget(600))
    assert given.work.by_task == {} and given.work.task == "lm"


def test_stage_1_goes_on_in_its_own_folder_after_the_batches_replanned_it(tmp_path, monkeypatch):
    # Stage 1 planned with the default singles, replaced by the language model's while it ran, then gone on with
    # (the budget kept for stage 1b) with a re-plan: its folder's plan stands, no --resume refusal.
    import sys

    import trainfast.tune.search as search_module
    from trainfast.ablation.store import RunStore
    from trainfast.ablation.work import BuiltinSpec
    from trainfast.tune.budget import SearchBudget
    from trainfast.tune.options import tune_options

    stores = []
    monkeypatch.setattr(search_module, "run_ladder", lambda rungs, work, settings, out, ladder, measure:
                        stores.append(RunStore(out, settings, ladder.resume)))
    opts = tune_options({"command": [sys.executable, "-c", "pass"], "out": tmp_path / "tune", "amp_dtype": "bf16",
                         "show": False})
    search, singles = search_module.prepare_search(BuiltinSpec(), None, "cpu", opts, SearchBudget(600))
    search.stage("singles", singles, 2)
    search.work.follow_task(singles, {"batches": LM_SEEN})
    search.stage("singles", search.replan(), 2, again=True)
    assert len(stores) == 2 and stores[1].resume


def test_a_token_run_is_timed_whole_and_its_warm_up_found_per_token():
    # A grouped run: its longest batches first (as transformers' length-grouped sampler puts them), then the short
    # ones, each step at 10 ms a token after a first step that compiles. On the seconds alone the long steps read as
    # warm-up (4x the later median) and would be left out; per token, only the first step is.
    from trainfast.measure import StepTime, Timing

    tokens = [100] + [400] * 6 + [100] * 10
    seconds = [5.0] + [0.01 * n for n in tokens[1:]]
    steps = [StepTime(s, n, 0.0) for s, n in zip(seconds, tokens)]
    per_token = Timing.from_steps(steps, per_sample=True)
    assert per_token.warmup_steps == 1
    assert per_token.throughput == pytest.approx(sum(tokens[1:]) / sum(seconds[1:]))
    assert Timing.from_steps(steps).warmup_steps == 7           # what timing on the seconds alone would drop


@pytest.mark.parametrize("batches", ["tokens", "images"])
def test_speed_mode_times_a_token_script_to_its_end_and_stops_any_other(tmp_path, batches):
    from trainfast.probe import MeasureSpec, Probe, StopRun

    spec = MeasureSpec(str(tmp_path / "result.json"), "speed", steps=8, seconds=60.0, floor=4, min_seconds=0.0)
    probe = Probe(spec)
    probe.batches = BatchKind()
    torch.manual_seed(0)
    if batches == "tokens":
        model = LabelledLM()
        data = [(torch.randint(1, 50, (4, 4 + 4 * (i % 3))),) for i in range(48)]
    else:
        model = nn.Sequential(nn.Conv2d(3, 4, 3), nn.Flatten(), nn.LazyLinear(2))
        data = [(torch.randn(4, 3, 8, 8),) for _ in range(48)]
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    stopped_at = None
    try:
        for i, (x,) in enumerate(data):
            out = model(input_ids=x, labels=x) if batches == "tokens" else model(x).sum()
            out.backward()
            opt.step()
            opt.zero_grad()
            try:
                probe._global_step(opt, (), {})
            except StopRun:
                stopped_at = i + 1
                break
    finally:
        probe.batches.close()
    record = probe.result("script ended")
    if batches == "tokens":
        assert stopped_at is None and record["whole_run"] and record["unit"] == "tokens"
        timing = record["timing"]
        assert timing["warmup_steps"] + timing["timed_steps"] == len(data)
    else:
        assert stopped_at is not None and stopped_at < len(data) and not record["whole_run"]


def test_documents_are_counted_beside_tokens_packed_or_padded():
    from trainfast.instruments.batches import documents_in

    ids = torch.tensor([[5, 6, 7, 0, 0], [8, 9, 0, 0, 0]])
    padded = {"input_ids": ids, "attention_mask": (ids != 0).long()}
    assert int(documents_in(padded, 0)) == 2
    # the same five tokens packed in one row of width 7: two documents, then a pad tail whose positions restart
    packed = {"input_ids": torch.tensor([[5, 6, 7, 8, 9, 0, 0]]), "position_ids": torch.tensor([[0, 1, 2, 0, 1, 0, 1]])}
    assert int(documents_in(packed, 0)) == 2 and int(documents_in(packed, None)) == 3
    assert documents_in({"input_ids": ids}, None) == 2


def test_a_token_runs_record_gives_documents_per_second_beside_tokens(tmp_path):
    from trainfast.probe import MeasureSpec, Probe

    probe = Probe(MeasureSpec(str(tmp_path / "result.json"), "full"))
    probe.batches = BatchKind()
    model, opt = LabelledLM(), None
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        for step in range(12):
            ids = torch.randint(1, 50, (4, 6))
            model(input_ids=ids, labels=ids).backward()      # 4 documents, 4 x 5 predicted tokens a step
            opt.step()
            opt.zero_grad()
            probe._global_step(opt, (), {})
    finally:
        probe.batches.close()
    record = probe.result("script ended")
    assert record["unit"] == "tokens"
    assert record["documents_per_s"] == pytest.approx(record["throughput"] * 4 / 20)


def test_a_scripts_first_step_is_timed_from_its_first_training_forward(tmp_path, monkeypatch):
    """Without a Session the step clock starts at the first training forward (BatchKind's on_start): the first
    step's forward, where a compiled model compiles, is in its time, and so in a curve's training time; an
    evaluation before training (eval mode, no grad) and whatever the script does before its first training
    forward are not. On a virtual clock that only the test moves."""
    import trainfast.measure.clock
    from conftest import VirtualTime

    from trainfast.probe import MeasureSpec, Probe

    virtual = VirtualTime()
    monkeypatch.setattr(trainfast.measure.clock, "time", virtual)

    class SlowFirstForward(nn.Linear):
        calls = 0

        def forward(self, x):
            SlowFirstForward.calls += 1
            # the first training forward (the first call evaluates) takes 0.3 s, every later one 0.01 s
            virtual.advance(0.3 if SlowFirstForward.calls == 2 else 0.01)
            return super().forward(x)

    probe = Probe(MeasureSpec(str(tmp_path / "result.json"), "full"))
    probe.batches = BatchKind(on_start=probe.training_began)
    model = SlowFirstForward(4, 2)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    try:
        model.eval()
        with torch.no_grad():
            model(torch.randn(2, 4))
        assert probe.timer is None                  # an evaluation starts no clock
        virtual.advance(1.0)                        # the script's own set-up: no step's
        model.train()
        for _ in range(3):
            model(torch.randn(2, 4)).sum().backward()
            opt.step()
            opt.zero_grad()
            probe._global_step(opt, (), {})
    finally:
        probe.batches.close()
    assert [s.seconds for s in probe.timer.read()] == pytest.approx([0.3, 0.01, 0.01])
