"""trainfast doctor: a user's own loop under the doctor: the sync counter, evaluation, dropout, zero_grad,
DataParallel, workers, the machine's load and the compute dtype, each mistake flagged in a loop that has it and not
in its corrected twin."""
import contextlib
import os
import signal
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from trainfast import envcheck
from trainfast.checks import NOT_HERE, Observations, bound, run_checks
from trainfast.doctor import observe_loop
from trainfast.envcheck import collect_environment
from trainfast.instruments.evalcheck import check_eval_dropout
from trainfast.instruments.watch import EnoughSteps, SyncCounter, Watch
from doctor_kit import (AttentionDropout, CLOCKS, LOAD_WINDOW_S, Net, Sampler, compute_obs, evaluating_loop,
                        finding, in_place_status, loop_findings, run_loop, virtual_clock, zero_grad_finding)
# the shared fixtures, by name (pytest hands them to the tests that name them; no_load_window is autouse)
from doctor_kit import no_load_window  # noqa: F401


def test_sync_counter_counts_exactly_two_item_calls_per_step():
    obs, findings = loop_findings(reads=2)
    assert obs.sync_steps == 4
    assert sum(s["calls"] for s in obs.user_syncs()) == 2 * 4
    assert all("loss.item()" in s["where"] and "doctor_kit.py" in s["where"] for s in obs.user_syncs())
    syncs = finding(findings, "host-device syncs per step")
    assert syncs.status == "measured" and "cost nothing here; on a GPU each one stalls it" in syncs.evidence
    assert "keep values on the device" in syncs.evidence                 # the fix a GPU would need
    _, twin = loop_findings(reads=0)
    assert finding(twin, "host-device syncs per step").status == "fine"


def test_a_loop_that_ends_before_its_timed_steps_is_told_so_not_that_the_platform_cannot_count(capsys):
    from trainfast.doctor import print_findings

    obs = observe_loop(lambda: run_loop(steps=3), steps=4, sync_steps=4)
    findings = run_checks(obs)
    assert obs.steps_run == 3 and not obs.step_seconds
    for name in ("page faults: fresh memory every step", "compute throughput vs matmul peak"):
        found = finding(findings, name)
        assert found.status == NOT_HERE and "no step was timed: the loop made 3 optimizer step(s)" in found.evidence
    print_findings(findings, obs)
    assert "note: no step was timed" in capsys.readouterr().out
    # its model, local to the loop's function, is gone when the loop returns: the checks that run it still do
    assert finding(findings, "dropout active in eval mode").status == "fine"


def test_a_compute_bound_fp32_loop_is_shown_the_half_types_higher_roof():
    near = finding(run_checks(compute_obs(0.8, ("bf16", 440e9))), "compute throughput vs matmul peak")
    assert near.status == "measured"                       # a lever, not a mistake: fp32 is the user's choice
    assert "measured bf16 matmul peak is 440 GFLOP/s (2.2x): mixed precision raises the roof" in near.evidence
    assert "`--precision bf16`" in near.evidence
    script = finding(run_checks(compute_obs(0.8, ("bf16", 440e9), recipe_flags=False)),
                     "compute throughput vs matmul peak")
    assert "autocast in bf16" in script.evidence and "--switches amp -- COMMAND" in script.evidence
    # far from the roof (input- or overhead-bound), a half type barely faster, or none fast here: nothing added
    for obs in (compute_obs(0.3, ("bf16", 440e9)), compute_obs(0.8, ("bf16", 250e9)), compute_obs(0.8, None)):
        assert "raises the roof" not in finding(run_checks(obs), "compute throughput vs matmul peak").evidence


def test_the_same_per_step_reads_are_a_problem_on_a_gpu():
    import dataclasses

    obs, _ = loop_findings(reads=2)
    on_gpu = dataclasses.replace(obs, device="cuda:0")          # the counts as a GPU loop would give them
    syncs = finding(run_checks(on_gpu), "host-device syncs per step")
    assert syncs.status == "problem" and "keep values on the device" in syncs.fix
    assert "cost nothing here" not in syncs.evidence


def test_sync_counter_ops_and_torch_internals():
    x = torch.randn(3)
    with SyncCounter("cpu") as counter:
        x.sum().item(), x.tolist(), bool(x.sum() > 0), float(x.sum()), x.cpu(), f"{x.sum():.2f}", x.numpy()
        torch.optim.AdamW([nn.Parameter(torch.ones(2))]).step()      # torch's own step-counter reads: not ours
    assert sorted(s["op"] for s in counter.by_line()) == sorted(
        ["item", "tolist", "bool", "float", "cpu", "format", "numpy"])


def test_eval_building_a_graph_is_flagged_and_twin_is_not():
    _, findings = loop_findings(evaluate="graph")
    assert finding(findings, "evaluation builds an autograd graph").status == "problem"
    _, twin = loop_findings(evaluate="inference")
    assert finding(twin, "evaluation builds an autograd graph").status == "fine"
    _, none = loop_findings()
    assert finding(none, "evaluation builds an autograd graph").status == NOT_HERE


def test_functional_dropout_in_eval_is_flagged_with_its_line():
    result = check_eval_dropout(Net(functional_dropout=True), torch.randn(4, 8))
    assert result["relative_diff"] > 0.01 and any("F.dropout(h, 0.5)" in c for c in result["calls"])
    assert check_eval_dropout(Net(), torch.randn(4, 8)) == {"max_diff": 0.0, "relative_diff": 0.0, "calls": [],
                                                            "random_calls": []}
    _, findings = loop_findings(model=Net(functional_dropout=True))
    assert finding(findings, "dropout active in eval mode").status == "problem"
    _, twin = loop_findings(model=Net())
    assert finding(twin, "dropout active in eval mode").status == "fine"


def test_zero_grad_without_set_to_none_and_missing_zero_grad():
    obs, findings = loop_findings(zero="zeroed")
    flagged = finding(findings, "zero_grad without set_to_none")
    assert flagged.status == in_place_status(flagged) and "set_to_none=True" in flagged.fix
    assert "set_to_none=False" in flagged.evidence and "doctor_kit.py" in flagged.evidence
    assert obs.zero_grad_s is not None and flagged.cost_s == obs.zero_grad_s      # the in-place call, timed
    _, never = loop_findings(zero="never")
    assert "never called" in finding(never, "zero_grad without set_to_none").evidence
    _, twin = loop_findings(zero="none")
    assert finding(twin, "zero_grad without set_to_none").status == "fine"


def test_a_forward_that_samples_is_not_called_dropout():
    sampled = check_eval_dropout(Sampler(), torch.randn(4, 8))
    assert sampled["relative_diff"] > 1e-3 and not sampled["calls"]
    assert sampled["random_calls"] and sampled["random_calls"][0].startswith("randn_like() at ")
    _, findings = loop_findings(model=Sampler())
    found = finding(findings, "dropout active in eval mode")
    assert found.status == "measured" and "randn_like" in found.evidence and "VAE" in found.evidence
    attention = check_eval_dropout(AttentionDropout(), torch.randn(4, 8))
    assert attention["relative_diff"] > 1e-3 and "dropout_p=0.5" in attention["calls"][0]


def test_the_doctors_own_counter_breaks_no_compiled_graph():
    """The sync counter sees every torch call, and Dynamo traces it into a compiled forward: its walk of the
    caller's frames would break the loop's graph, a break the compile check then blamed on the loop."""
    import torch._dynamo
    from torch._dynamo.utils import counters

    torch._dynamo.reset()
    counters.clear()
    obs, findings = loop_findings(model=torch.compile(Net(), backend="eager"), reads=1)
    found = finding(findings, "compile: graph breaks and recompilations")
    assert obs.compiled and found.status == "fine" and "0 graph break(s)" in found.evidence, found.evidence
    assert sum(s["calls"] for s in obs.user_syncs()) == 4                # the loop's reads are still counted


def test_a_grad_free_forward_inside_the_step_is_not_an_evaluation():
    """Pseudo-labels: each step labels a batch with the model itself (grad-free, in training mode) and trains
    on it; the evaluation, in eval mode, comes at the epoch's end. Two grad-free forwards in a row are one."""
    def loop(model, eval_mode: bool):
        return evaluating_loop(model, eval_mode, epochs=2, steps=8, pseudo_labels=True)

    name = "evaluation without model.eval()"
    obs = observe_loop(loop(Net(), eval_mode=True), steps=2, sync_steps=2)
    found = finding(run_checks(obs), name)
    assert obs.train_mode_eval is None and found.status == "fine" and "ran in eval mode" in found.evidence
    assert obs.eval_wait["outcome"] == "reached" and obs.eval_wait["steps"] > 0     # waited for the real one
    planted = observe_loop(loop(Net(), eval_mode=False), steps=2, sync_steps=2)
    assert finding(run_checks(planted), name).status == "problem" and planted.train_mode_eval["forwards"] == 2


def test_workers_are_not_advised_where_handing_a_batch_over_costs_more_than_the_wait():
    """A TensorDataset loop's wait is a per-sample index and a collate, a fraction of a millisecond: a worker
    adds more than that to hand each batch over, and on 2 cores takes one from the step. With workers, a wait
    no longer than twice the handoff is the handoff itself: more workers would not shorten it."""
    from trainfast.doctor.loop import worker_handoff_s

    assert 0 < worker_handoff_s([torch.randn(64, 64), torch.arange(64)]) < 1.0
    assert worker_handoff_s(["no tensor"]) is None
    obs = Observations("own loop", "cpu", collect_environment())
    obs.recipe_flags, obs.num_workers, obs.handoff_s = False, 0, 0.5e-3
    obs.step_seconds, obs.data_wait_s = [0.9e-3] * 5, [0.25e-3] * 5           # 28% of a 0.9 ms step
    findings = run_checks(obs)
    workers, wait = finding(findings, "num_workers=0"), finding(findings, "waiting for the next batch")
    assert workers.status == "measured" and "cannot win the wait back" in workers.evidence
    assert wait.status == "measured" and wait.fix.startswith("not loader workers") and "--" not in wait.fix
    obs.handoff_s = 0.05e-3                                                    # a wait workers do win back
    findings = run_checks(obs)
    assert finding(findings, "num_workers=0").status == "problem"
    wait = finding(findings, "waiting for the next batch")
    assert wait.status == "problem" and "num_workers=N" in wait.fix
    obs.num_workers, obs.handoff_s = 2, 0.2e-3             # with workers: the wait is their handoff, not their work
    wait = finding(run_checks(obs), "waiting for the next batch")
    assert wait.status == "measured" and "mostly that handoff" in wait.evidence and "num_workers=0" in wait.fix


def test_other_processes_on_the_cores_are_named_and_the_free_cores_advised():
    """Another process busy on the loop's cores makes torch's threads wait for one another: the timed findings
    are a shared machine's, and the doctor says so instead of 'fine' beside steps 50x slower. The load as the
    counters give it (other_cores) and the finding on it; test_other_processes_on_the_cores_are_measured_and_named
    (slow) measures a real spinning process."""
    from trainfast.envcheck import cpu_seconds, other_cores

    assert other_cores((0.0, 10.0, 4.0), (2.0, 13.0, 4.5)) == pytest.approx(1.25)   # 3 busy s, 0.5 ours, in 2 s
    assert other_cores(None, (1.0, 1.0, 1.0)) is None and cpu_seconds() is not None
    obs = Observations("own loop", "cpu", collect_environment(), step_seconds=[0.01] * 5, cpus=4, threads=4,
                       other_cores=1.2)
    found = finding(run_checks(obs), "other processes on the cores")
    assert found.status == "problem" and "shared machine" in found.evidence, found.evidence
    assert "torch.set_num_threads(2)" in found.fix                     # 4 CPUs, 2 of them taken
    obs.other_cores = 0.1
    assert finding(run_checks(obs), "other processes on the cores").status == "fine"
    obs.other_cores = None
    assert finding(run_checks(obs), "other processes on the cores").status == NOT_HERE


# Slow: a process spinning beside the loop. Fast: test_other_processes_on_the_cores_are_named_and_the_free_cores_advised
@pytest.mark.slow
@pytest.mark.alone
def test_other_processes_on_the_cores_are_measured_and_named(monkeypatch):
    """The same with a real process spinning on a core, read by the doctor's own counters over the timed steps."""
    import subprocess

    monkeypatch.setattr(envcheck, "LOAD_WINDOW_S", LOAD_WINDOW_S)
    # not a child of this process (the loop's children are its own, its loader workers): started from a shell
    # that exits at once, so it belongs to nobody here
    spinner = int(subprocess.run(["sh", "-c", f"'{sys.executable}' -c 'while True: pass' >/dev/null 2>&1 & echo $!"],
                                 capture_output=True, text=True, check=True).stdout)
    try:
        time.sleep(0.5)
        obs = observe_loop(lambda: run_loop(steps=400), steps=60, sync_steps=2, eval_within=0)
    finally:
        os.kill(spinner, signal.SIGKILL)
    found = finding(run_checks(obs), "other processes on the cores")
    assert obs.other_cores >= 0.5 and found.status == "problem", found.evidence
    assert "torch.set_num_threads(" in found.fix and "shared machine" in found.evidence
    obs.other_cores = 0.1
    assert finding(run_checks(obs), "other processes on the cores").status == "fine"


def test_zero_grad_read_before_the_next_gradient_whatever_the_order():
    """zero_grad after the forward (the detection reference engine's order), after the step, or before the
    forward: the gradients are read when the next step's first gradient arrives, so each is told apart."""
    def loop(order: str, set_to_none: bool = True):
        def run():
            model = Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            g = torch.Generator().manual_seed(0)
            for _ in range(12):
                x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
                if order == "first":
                    optimizer.zero_grad(set_to_none=set_to_none)
                loss = F.cross_entropy(model(x), y)
                if order == "after_forward":
                    optimizer.zero_grad(set_to_none=set_to_none)
                loss.backward()
                optimizer.step()
                if order == "after_step":
                    optimizer.zero_grad(set_to_none=set_to_none)
        return run

    for order in ("first", "after_forward", "after_step"):
        obs, clean = zero_grad_finding(loop(order))
        assert clean.status == "fine" and set(obs.grads) == {"none"}, (order, clean.evidence)
        obs, kept = zero_grad_finding(loop(order, set_to_none=False))
        assert kept.status == in_place_status(kept) and set(obs.grads) == {"zeroed"}, (order, kept.evidence)
        assert "set_to_none=False" in kept.evidence and "never" not in kept.evidence


def test_zero_grad_once_an_epoch_is_not_once_a_step():
    def loop():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(3):
            optimizer.zero_grad()                       # at the epoch's start only
            for _ in range(6):
                F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
                optimizer.step()

    obs, found = zero_grad_finding(loop)
    assert found.status == "problem" and "carried" in obs.grads
    assert "not between every optimizer step" in found.evidence and "test_doctor_loops.py" in found.evidence


def test_zero_grad_with_two_optimizers_and_with_accumulation():
    """A GAN's order (the generator's backward reaches the discriminator's gradients before its own zero_grad)
    and gradient accumulation (zero_grad every other backward) are both right, and both read fine."""
    def gan():
        g_net, d_net = nn.Linear(4, 8), nn.Sequential(nn.Linear(8, 1))
        g_opt, d_opt = torch.optim.Adam(g_net.parameters()), torch.optim.Adam(d_net.parameters())
        for _ in range(12):
            real, fake = torch.randn(4, 8), g_net(torch.randn(4, 4))
            d_opt.zero_grad()
            (d_net(real).mean() - d_net(fake.detach()).mean()).backward()
            d_opt.step()
            g_opt.zero_grad()
            d_net(fake).mean().backward()              # adds into the discriminator's gradients too
            g_opt.step()

    def accumulating():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for i in range(24):
            (F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))) / 2).backward()
            if i % 2 == 1:
                optimizer.step()
                optimizer.zero_grad()

    for loop in (gan, accumulating):
        obs, found = zero_grad_finding(loop)
        assert found.status == "fine" and obs.grads and set(obs.grads) == {"none"}, (loop.__name__, found.evidence)


def test_evaluation_reads_are_not_per_step_syncs():
    """A short epoch whose evaluation (a metric read per batch) falls inside the counted steps: those reads are
    once per evaluation, not per training step."""
    def loop():
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
        for _ in range(6):
            for _ in range(3):
                optimizer.zero_grad()
                F.cross_entropy(model(torch.randn(4, 8)), torch.randint(0, 3, (4,))).backward()
                optimizer.step()
            model.eval()
            with torch.no_grad():
                correct = sum((model(torch.randn(4, 8)).argmax(1) == 0).sum().item() for _ in range(4))
            model.train()
            print(correct)

    obs = observe_loop(loop, steps=4, sync_steps=6)
    assert obs.user_syncs() == [] and finding(run_checks(obs), "host-device syncs per step").status == "fine"


def test_evaluation_without_model_eval():
    """A grad-free forward of the trained model in training mode is an evaluation without model.eval(): a
    problem where something in the model acts differently (nn.Dropout; F.dropout following self.training),
    harmless where nothing does."""
    class Follows(nn.Module):                       # dropout that follows self.training, no Dropout module
        def __init__(self) -> None:
            super().__init__()
            self.fc = nn.Linear(8, 3)

        def forward(self, x):
            return self.fc(F.dropout(x, 0.5, training=self.training))

    def loop(model, eval_mode: bool):
        return evaluating_loop(model, eval_mode, epochs=3, steps=5)

    name = "evaluation without model.eval()"
    for model, status in ((Net(), "problem"), (Follows(), "problem"), (nn.Linear(8, 3), "fine"),
                          (Sampler(), "fine")):
        obs = observe_loop(loop(model, eval_mode=False), steps=2, sync_steps=2)
        found = finding(run_checks(obs), name)
        assert found.status == status and obs.train_mode_eval["forwards"] == 2, (type(model).__name__, found.evidence)
        assert obs.eval_wait["outcome"] == "reached"   # the watched steps end at 5: the evaluation came after
        twin = finding(run_checks(observe_loop(loop(model, eval_mode=True), steps=2, sync_steps=2)), name)
        assert twin.status == "fine" and "ran in eval mode" in twin.evidence
    assert "Dropout" in finding(run_checks(observe_loop(loop(Net(), False), steps=2, sync_steps=2)), name).evidence


def test_data_parallel_is_flagged_and_twin_is_not():
    _, findings = loop_findings(model=nn.DataParallel(Net()))     # on a CPU it runs the module as it is
    assert finding(findings, "DataParallel where DDP would serve").status == "problem"
    _, twin = loop_findings(model=Net())
    assert finding(twin, "DataParallel where DDP would serve").status == "fine"


def test_own_loop_without_trainfast_loader_says_not_checked():
    obs, findings = loop_findings()
    assert obs.data_wait_s is None
    assert finding(findings, "waiting for the next batch").status == NOT_HERE
    assert finding(findings, "num_workers=0").status == NOT_HERE
    assert "draws no batch from a torch DataLoader" in finding(findings, "waiting for the next batch").evidence


@pytest.mark.parametrize("clock", CLOCKS)
def test_own_loop_data_wait_from_its_dataloader(clock):
    """An own loop's wait is read from its DataLoader's next(): each sample of its dataset takes 10 ms (of the
    virtual clock in the fast suite, a sleep in the slow one) and on the virtual clock its step 2 ms more."""
    from torch.utils.data import DataLoader, TensorDataset

    with virtual_clock() if clock == "virtual" else contextlib.nullcontext() as virtual:
        class Slow(TensorDataset):
            def __getitem__(self, index):
                (virtual or time).sleep(0.01)
                return super().__getitem__(index)

        data = Slow(torch.randn(64, 8), torch.randint(0, 3, (64,)))
        model = Net()
        optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

        def loop():
            for _ in range(10):
                for x, y in DataLoader(data, batch_size=4):
                    optimizer.zero_grad()
                    F.cross_entropy(model(x), y).backward()
                    if virtual:
                        virtual.advance(0.002)
                    optimizer.step()

        obs = observe_loop(loop, steps=4, sync_steps=2, eval_within=0)     # it never evaluates: no wait for it
    assert obs.num_workers == 0 and obs.samples == [4] * len(obs.samples)
    assert obs.wait_share >= 0.2 and bound(obs) == "input-bound"        # no replay for an own loop: the wait alone
    if virtual:                                                         # 4 reads of 10 ms, then 2 ms of step
        assert obs.step_seconds == pytest.approx([0.042] * len(obs.step_seconds))
        assert obs.wait_share == pytest.approx(0.04 / 0.042)
    assert finding(run_checks(obs), "num_workers=0").status == "problem"
    # the model's FLOPs on a copy: forward 2x8x16 + 2x16x3 = 352 per sample; backward 448 (fc2's input and
    # weight gradients, fc1's weight gradient: its input needs none)
    assert obs.flops_per_sample == 800 and obs.ceiling_flops > 0
    assert finding(run_checks(obs), "compute throughput vs matmul peak").status == "measured"


def test_a_failing_hook_never_breaks_the_loop(monkeypatch):
    import trainfast.instruments.watch

    def fails(module):          # as inspecting a model split over devices might
        raise RuntimeError("expected all tensors to be on the same device")

    monkeypatch.setattr(trainfast.instruments.watch, "grads_state", fails)
    obs = observe_loop(lambda: run_loop(), steps=4, sync_steps=2)
    assert obs.steps_run == 7 and any("failed and was skipped" in note for note in obs.notes)
    assert obs.grads == []          # so that check says "not checked here", not "fine"


def test_syncs_inside_a_librarys_own_loop_get_that_librarys_fix_not_the_scripts():
    from trainfast.checks import sync_fix

    lib = [{"where": "/v/lib/python3.11/site-packages/transformers/trainer.py:1919  `if (`", "calls": 20},
           {"where": "/v/lib/python3.11/site-packages/transformers/masking_utils.py:354  `and`", "calls": 10}]
    fix = sync_fix(lib)
    assert "in the code of transformers, not the script" in fix and "logging_nan_inf_filter=False" in fix
    mine = lib + [{"where": "train.py:40  `loss.item()`", "calls": 10}]
    assert sync_fix(mine).startswith("keep values on the device")


def test_an_own_loops_compute_dtype_is_read_from_its_autocast_or_its_weights():
    # the matmul peak a loop is compared with is the one of the dtype it computes in, not fp32 by assumption
    def loop(autocast: bool, cast: torch.dtype | None = None):
        def run():
            model = Net().to(cast) if cast else Net()
            optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
            for _ in range(8):
                x, y = torch.randn(4, 8).to(cast or torch.float32), torch.randint(0, 3, (4,))
                optimizer.zero_grad()
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
                    loss = F.cross_entropy(model(x).float(), y)
                loss.backward()
                optimizer.step()
        return run

    from trainfast.doctor.peaks import loop_dtype

    def dtype_of(run):
        seen = []
        watch = Watch(None, sync_window=(1, 2), stop_after=6, on_stop=lambda w: seen.append(loop_dtype(w)))
        with watch:
            try:
                run()
            except EnoughSteps:
                pass
        return seen[0]

    assert dtype_of(loop(autocast=True)) == torch.bfloat16
    assert dtype_of(loop(autocast=False)) == torch.float32
    assert dtype_of(loop(autocast=False, cast=torch.bfloat16)) == torch.bfloat16


def test_what_compiled_before_the_loop_is_not_the_loops():
    """Dynamo's counters count for the whole process: a graph break compiled before the observed loop (another
    model, a library's compiled step) is not reported as the loop's."""
    @torch.compile(backend="eager")
    def broken(x):
        x = x + 1
        torch._dynamo.graph_break()
        return x * 2

    broken(torch.ones(2))
    obs, findings = loop_findings()
    assert not (obs.compile or {}).get("graph_breaks")
    assert finding(findings, "compile: graph breaks and recompilations").status != "problem"
