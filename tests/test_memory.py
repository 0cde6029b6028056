"""A step's memory by what holds it (measure/memory.py): each item agrees with what it is known to be (the
parameters' bytes, their gradients', the optimizer's state as stored, the tensors kept for backward), the largest
is named, and a measured Session run's record carries it."""
from __future__ import annotations

import pytest
import torch
from conftest import saved_bytes

from trainfast.measure.memory import StepMemory, breakdown, largest, state_bytes

WIDTH, BATCH = 512, 256


def mlp() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(WIDTH, 4 * WIDTH), torch.nn.GELU(), torch.nn.Linear(4 * WIDTH, WIDTH))


def profiled(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict:
    memory = StepMemory(torch.device("cpu"), optimizer)
    for x in memory.around([torch.randn(BATCH, WIDTH) for _ in range(3)]):
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
    return memory.result()


def test_each_item_is_what_it_is_known_to_be_and_the_largest_is_named():
    """AdamW on a 2.1M-parameter MLP: at the step's peak (the optimizer's step) the parameters, their gradients and
    the two moments are exactly their bytes; the activations' own highest is what the forward kept for backward
    (within 5%: the profiler sees the kept tensors where they are made); the parts add up to the peak."""
    model = mlp()
    optimizer = torch.optim.AdamW(model.parameters())
    memory = profiled(model, optimizer)
    weights = sum(p.numel() * p.element_size() for p in model.parameters())
    at_peak = memory["at_peak"]
    assert at_peak["parameters"] == weights and at_peak["gradients"] == weights
    assert at_peak["optimizer_state"] == pytest.approx(2 * weights, abs=64)          # the step counters' bytes
    x = torch.randn(BATCH, WIDTH)
    kept = saved_bytes(model, lambda: model(x).square().mean())
    assert memory["highest"]["activations"] == pytest.approx(kept, rel=0.05)
    assert sum(at_peak.values()) == memory["peak_bytes"] and memory["step"] == 1
    assert largest(memory) == ("optimizer_state", at_peak["optimizer_state"])


def test_a_low_bit_state_is_counted_as_the_optimizer_stores_it():
    pytest.importorskip("torchao")
    from trainfast.techniques.optimizer_state import apply_optimizer_state

    model = mlp()
    full = profiled(model, torch.optim.AdamW(model.parameters()))
    model = mlp()
    optimizer = apply_optimizer_state(torch.optim.AdamW(model.parameters()), "8bit")
    low = profiled(model, optimizer)
    assert low["at_peak"]["optimizer_state"] == state_bytes(optimizer)
    assert low["at_peak"]["optimizer_state"] < 0.3 * full["at_peak"]["optimizer_state"]
    assert low["peak_bytes"] < full["peak_bytes"]


def test_the_split_is_taken_at_the_highest_total():
    rows = [[0, 10, 0, 1, 0, 50, 0, 0, 0],         # end of forward: activations
            [0, 10, 20, 1, 0, 5, 10, 2, 3]]        # optimizer step: state, gradients, the rest
    memory = breakdown(rows)
    assert memory["peak_bytes"] == 61 and memory["at_peak"]["activations"] == 50
    assert memory["highest"]["optimizer_state"] == 20 and memory["highest"]["other"] == 5   # autograd's own + none
    assert breakdown([]) is None


def test_a_step_that_compiles_is_not_profiled_the_next_one_is(monkeypatch):
    # A compiled model fed a new length recompiles inside the profiled step: the profiler (which records the tracing's
    # every operation with its shapes and stack) stops at the compile's start, and the next step is profiled.
    import torch._dynamo

    def run(model, lengths):
        optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
        memory = StepMemory(torch.device("cpu"), optimizer)
        for x in memory.around([torch.randint(0, 50, (2, n)) for n in lengths]):
            model(x).float().mean().backward()
            optimizer.step()
        return memory, memory.result()

    torch._dynamo.reset()
    net = torch.nn.Sequential(torch.nn.Embedding(50, 8), torch.nn.Linear(8, 8))
    # the second length makes the dimension dynamic (a recompile in step 1); step 2's length reuses that graph
    memory, found = run(torch.compile(net, backend="eager"), [4, 5, 7, 9])
    assert found is not None and found["step"] == 2 and memory.compiling_steps == 1
    torch._dynamo.reset()
    memory, found = run(torch.compile(net, backend="eager", dynamic=False), [4, 5, 6, 7, 8, 9, 10])
    assert found is None and memory.compiling_steps == 4 and "each of the 4 steps profiled compiled" in memory.error
    torch._dynamo.reset()


def test_a_measured_session_run_records_its_steps_memory():
    from trainfast import Recipe, Session
    from trainfast.probe import MeasureSpec, Probe, run_record

    probe = Probe(MeasureSpec("", "full"))
    tf = Session(Recipe(), device="cpu")
    model = mlp()
    data = torch.utils.data.TensorDataset(torch.randn(4 * BATCH, WIDTH))
    model, optimizer, loader = tf.setup(model, torch.optim.AdamW(model.parameters()),
                                        torch.utils.data.DataLoader(data, batch_size=BATCH))
    probe.attach(tf)
    probe.watch(tf.state, 0)
    for (x,) in loader:
        optimizer.zero_grad()
        tf.backward(model(x).square().mean())
        optimizer.step()
    memory = run_record(probe, "end")["memory"]
    assert memory["at_peak"]["parameters"] == sum(p.numel() * 4 for p in model.parameters())
    assert largest(memory)[0] == "optimizer_state"


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device (make test-cuda on a GPU machine)")
def test_on_a_gpu_the_profiled_peak_is_the_allocators():
    """The allocator's own peak over the same step holds the breakdown's within 10% (its block rounding and the
    cuBLAS workspace are the difference)."""
    device = torch.device("cuda")
    model = mlp().to(device)
    optimizer = torch.optim.AdamW(model.parameters())
    memory = StepMemory(device, optimizer)
    batches = [torch.randn(BATCH, WIDTH, device=device) for _ in range(3)]
    for i, x in enumerate(memory.around(batches)):
        if i == 1:
            torch.cuda.reset_peak_memory_stats(device)
        model(x).square().mean().backward()
        optimizer.step()
        optimizer.zero_grad()
        if i == 1:
            torch.cuda.synchronize()
            allocator = torch.cuda.max_memory_allocated(device)
    assert memory.result()["peak_bytes"] == pytest.approx(allocator, rel=0.10)


def with_step_peak(rung, peak: int):
    for run in rung.repeats:
        run["memory"] = {"peak_bytes": peak, "device": "cpu", "step": 1,
                         "at_peak": dict.fromkeys(("parameters", "gradients", "optimizer_state", "activations",
                                                   "inputs", "temporaries", "other"), 0),
                         "highest": {}}
    return rung


def test_a_memory_limit_recommends_only_what_fits_and_says_what_did_not():
    """On a CPU the limit holds the profiled step's tensors (the resident set is the runtime's too). The baseline
    fits: a faster rung over the limit is not recommended. The baseline does not fit: the fastest rung that fits
    is, slower or not. Nothing fits: no recommendation, and the reason is the limit."""
    from conftest import scored_rung

    from trainfast.ablation.scoring import pick_best, score_rungs
    from trainfast.report.memory import limit_line
    from trainfast.results import AblationResult

    mib = 2**20
    base = with_step_peak(scored_rung("baseline", [100, 101, 99], 0.9), 400 * mib)
    fast = with_step_peak(scored_rung("fast", [150, 151, 149], 0.9, compile=True), 450 * mib)
    small = with_step_peak(scored_rung("small", [80, 81, 79], 0.9, activation_checkpointing=True), 200 * mib)
    rungs = [base, fast, small]
    score_rungs(rungs, {}, [0.9, 0.9, 0.9], None, "each")
    assert pick_best(rungs)[0] is fast
    assert pick_best(rungs, memory_limit=420 * mib)[0] is base
    assert pick_best(rungs, memory_limit=300 * mib)[0] is small
    assert pick_best(rungs, memory_limit=100 * mib)[0] is None
    result = AblationResult(rungs, {}, "", None, None, {}, settings={"memory_limit": 100 * mib})
    assert "no measured rung fits the memory limit of 100 MiB" in result.no_recommendation
    result.settings["memory_limit"] = 300 * mib
    assert limit_line(result) == ("Memory limit 300 MiB: over it, never recommended: baseline (400 MiB), fast "
                                  "(450 MiB); within it: small.")


def test_a_size_is_read_as_people_write_it_and_a_bad_one_refused():
    from trainfast.ablation.loop import LadderOptions
    from trainfast.defaults import parse_size
    from trainfast.recipe import RecipeError

    assert parse_size("2GiB") == parse_size("2G") == 2 * 2**30 and parse_size("1.5GB") == 1_500_000_000
    assert LadderOptions(memory_limit="512MiB").memory_limit == 512 * 2**20
    with pytest.raises(RecipeError, match="--memory-limit must be a size like 2GiB"):
        LadderOptions(memory_limit="lots")


def test_the_tunes_memory_stage_tries_smaller_batches_and_each_memory_switch():
    """The baseline, its batch at 1/2, 1/4 and 1/8, each memory switch its task can name alone and all together;
    no 8-bit Adam states for SGD, no chunked loss outside a language model, no batch rungs for a script."""
    from trainfast import Recipe
    from trainfast.tune.memory import memory_rungs

    lm = memory_rungs(Recipe(batch_size=16), "lm", batch_search=True)
    assert [r.name for r in lm] == ["baseline", "batch-8", "batch-4", "batch-2", "chunked_loss", "checkpointing",
                                    "optimizer_state", "chunked_loss+checkpointing+optimizer_state"]
    assert lm[-1].recipe.optimizer_state == "8bit" and lm[-1].recipe.chunked_loss and lm[3].recipe.batch_size == 2
    vision = memory_rungs(Recipe(batch_size=4, optimizer="sgd"), "classification", batch_search=False)
    assert [r.name for r in vision] == ["baseline", "checkpointing"]


def test_the_memory_stage_and_what_shrinks_each_item_are_declared_on_the_switches():
    """The memory stage's switches are the rungs that declare a memory-stage order; what shrinks each memory item
    is said by the switches that declare it (several joined, in declaration order)."""
    from trainfast import techniques
    from trainfast.measure.memory import ITEMS, largest_text

    assert [r.name for r in techniques.memory_rung_specs("lm")] == ["chunked_loss", "checkpointing", "optimizer_state"]
    assert [r.name for r in techniques.memory_rung_specs("classification")] == ["checkpointing", "optimizer_state"]
    shrink = techniques.memory_shrinkers()
    assert set(shrink) <= set(ITEMS) and "inputs" not in shrink
    assert shrink["activations"] == ("activation_checkpointing, or chunked_loss where the logits are the largest "
                                     "activation")
    memory = {"peak_bytes": 4 << 20, "at_peak": {**dict.fromkeys(ITEMS, 0), "optimizer_state": 3 << 20}}
    assert largest_text(memory, shrink).endswith("optimizer_state (8-bit or 4-bit Adam states) would shrink it")
    memory["at_peak"]["inputs"] = 4 << 20
    assert largest_text(memory, shrink).endswith("no single switch shrinks it")


def test_a_recommendation_over_the_limit_falls_back_to_what_fits():
    from conftest import scored_rung

    from trainfast import Recipe
    from trainfast.tune.combine import Decision
    from trainfast.tune.memory import held_to_limit

    class Options:
        memory_limit = 300 * 2**20

    class Search:
        options, base = Options(), Recipe(batch_size=4)

    combined = with_step_peak(scored_rung("compile", [150], 0.9, compile=True), 400 * 2**20)
    decision = held_to_limit(Search(), Decision(Recipe(compile=True), "compile"), [combined])
    assert decision.recipe == Search.base and "over the memory limit (400 MiB > 300 MiB)" in decision.dropped["compile"]
    fits = with_step_peak(scored_rung("compile", [150], 0.9, compile=True), 200 * 2**20)
    kept = Decision(Recipe(compile=True), "compile")
    assert held_to_limit(Search(), kept, [fits]) is kept


def test_a_sessions_own_loop_says_the_chunked_loss_cannot_reach_it():
    """A script's loop computes its loss itself: chunked_loss is said not to act (the ablation rules the rung out
    with why); the built-in run's task computes it, and nothing is said there."""
    from trainfast import Recipe, Session

    tf = Session(Recipe(chunked_loss=True), device="cpu")
    tf.setup(torch.nn.Linear(2, 2))
    assert "computes its loss" in tf.unsupported()["chunked_loss"]
    builtin = Session(Recipe(chunked_loss=True), device="cpu", builtin=True)
    builtin.setup(torch.nn.Linear(2, 2))
    assert "chunked_loss" not in builtin.unsupported()
