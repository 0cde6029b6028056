"""trainfast doctor: the built-in run under the doctor: input-bound or compute-bound, num_workers, zero_grad, its
largest memory item, the environment and the CUDA-only checks on a machine without a GPU."""

import pytest
import torch
from conftest import tiny_resnet

from trainfast.checks import NOT_HERE, Observations, bound, run_checks
from trainfast.doctor import observe_builtin
from trainfast.envcheck import collect_environment
from trainfast.models import resnet9
from trainfast.recipe import Recipe
from doctor_kit import (finding, observe, shapes_obs, tiny_split)
# the shared fixtures, by name (pytest hands them to the tests that name them; no_load_window is autouse)
from doctor_kit import (fast_run, no_load_window, runs)  # noqa: F401


def test_input_bound_run_is_called_input_bound(runs, request):
    slow_run = runs["slow"]
    assert bound(slow_run) == "input-bound"
    assert slow_run.wait_share >= 0.2 and slow_run.replay_gain >= 0.05     # the replay measured the bound
    if request.node.callspec.params["runs"] == "virtual":                   # 80 ms of wait in an 85 ms step
        assert slow_run.step_seconds == pytest.approx([0.085] * len(slow_run.step_seconds))
        assert slow_run.wait_share == pytest.approx(0.08 / 0.085) and slow_run.replay_s == pytest.approx(0.005)
    found = finding(run_checks(slow_run), "waiting for the next batch")
    assert found.status == "problem" and found.cost_s > 0 and "replaying one cached batch" in found.evidence


def test_compute_bound_run_is_not(runs):
    assert bound(runs["fast"]) == "compute-bound"
    assert finding(run_checks(runs["fast"]), "waiting for the next batch").status == "fine"


def test_num_workers_zero_flagged_only_when_the_wait_is_material(runs):
    slow = finding(run_checks(runs["slow"]), "num_workers=0")
    assert slow.status == "problem" and slow.fix == "--num-workers auto" and slow.cost_s > 0
    assert finding(run_checks(runs["fast"]), "num_workers=0").status == "fine"      # 0 workers, fast data: fine


def test_num_workers_zero_is_judged_on_the_wait_and_the_replay_together():
    """Below the input-bound line: material when the wait and the replay's gain are both >= MATERIAL_SHARE; a wait
    the replay does not confirm is the loader's noise."""
    obs = Observations("built-in", "cpu", collect_environment(), num_workers=0, handoff_s=0.1e-3,
                       step_seconds=[0.100] * 5, data_wait_s=[0.010] * 5, replay_step_seconds=[0.092] * 5)
    assert bound(obs) == "compute-bound" and obs.wait_share == pytest.approx(0.1)
    assert finding(run_checks(obs), "num_workers=0").status == "problem"                 # 10% wait, 8% gain
    assert finding(run_checks(obs), "waiting for the next batch").status == "measured"
    obs.replay_step_seconds = [0.099] * 5
    assert finding(run_checks(obs), "num_workers=0").status == "fine"                    # 1% gain: noise
    assert finding(run_checks(obs), "waiting for the next batch").status == "fine"


def test_num_workers_twin_is_not_flagged():
    obs = observe(tiny_split(delay=0.002), num_workers=2, persistent_workers=True)   # one worker start
    assert obs.num_workers == 2
    assert finding(run_checks(obs), "num_workers=0").status == "fine"


def test_builtin_zero_grad_is_fine_and_names_its_line(runs):
    """The built-in loop calls optimizer.zero_grad() (torch's default frees), with or without --set-to-none."""
    for obs in runs.values():
        found = finding(run_checks(obs), "zero_grad without set_to_none")
        assert found.status == "fine" and obs.grads and set(obs.grads) == {"none"}
        assert "engine.py" in found.evidence and "set_to_none=True" in found.evidence


def test_builtin_loop_is_checked_and_fine(fast_run):
    findings = run_checks(fast_run)
    assert finding(findings, "evaluation builds an autograd graph").status == "fine"   # actually checked
    assert fast_run.eval_forwards == 2
    assert finding(findings, "dropout active in eval mode").status == "fine"
    assert finding(findings, "evaluation without model.eval()").status == "fine"
    syncs = finding(findings, "host-device syncs per step")
    assert syncs.status == "fine" and fast_run.user_syncs() == []
    # the Meter's one read per window: a tolist and an item every log_every (10) steps
    assert sum(s["calls"] for s in fast_run.syncs) / fast_run.sync_steps == pytest.approx(0.2)
    assert len(fast_run.step_seconds) >= 3 and len(fast_run.replay_step_seconds) == len(fast_run.step_seconds)
    # the page faults, kernel and CPU seconds of each replayed step (the step's own), counted by getrusage
    assert len(fast_run.step_faults) == len(fast_run.step_kernel_s) == len(fast_run.step_seconds)
    assert all(f >= 0 for f in fast_run.step_faults) and len(fast_run.step_cpu_s) == len(fast_run.step_faults)
    assert "cached-batch replay" in fast_run.fault_source and set(fast_run.reuse_memory) == {"in_effect", "unavailable"}


def test_the_builtin_runs_largest_memory_item_is_named_with_its_switch(fast_run):
    """One more step profiled by what holds the memory: its parameters are the model's bytes, and the finding names
    the largest item at the step's peak with the switch that would shrink it."""
    memory = fast_run.memory["breakdown"]
    weights = sum(p.numel() * 4 for p in resnet9(10, widths=(64, 128, 128, 256)).parameters())
    assert memory["at_peak"]["parameters"] == weights
    item = max(memory["at_peak"], key=memory["at_peak"].get)
    text = finding(run_checks(fast_run), "memory peak vs capacity").evidence
    peak = f"{memory['peak_bytes'] / 2**20:,.0f} MiB"
    assert f"the largest item at the profiled step's peak ({peak} of tensors) is its {item.replace('_', ' ')}" in text
    assert "would shrink it" in text or "no single switch" in text


def test_cudnn_benchmark_with_changing_shapes():
    varying = [[[8, 3, s, s]] for s in (16, 20, 24, 28)]
    fixed = [[[8, 3, 16, 16]]] * 6 + [[[3, 3, 16, 16]]]          # full batches and the last, short one
    name = "cudnn.benchmark with changing input shapes"
    assert finding(run_checks(shapes_obs("cuda:0", varying)), name).status == "problem"
    assert finding(run_checks(shapes_obs("cuda:0", fixed)), name).status == "fine"
    assert finding(run_checks(shapes_obs("cuda:0", varying, benchmark=False)), name).status == "fine"
    assert finding(run_checks(shapes_obs("cpu", varying)), name).status == NOT_HERE


def test_environment_facts_on_cpu():
    env = collect_environment()
    assert env["torch"] == torch.__version__ and env["cpu_cores"] >= 1 and env["torch_threads"] >= 1
    assert env["smoke"][0] == {"device": "cpu", "conv": "ok", "matmul": "ok"}
    assert isinstance(env["cpu_flags"], list) and isinstance(env["cpu_bf16"], bool)
    if not torch.cuda.is_available():
        assert env["devices"] == [] and env["no_gpu_reason"]


@pytest.mark.skipif(torch.cuda.is_available(), reason="checks the answer without a GPU")
def test_cuda_only_checks_say_not_checked_here(fast_run):
    findings = run_checks(fast_run)
    for name in ("launch-bound steps", "tensors created on the host and copied every step",
                 "cudnn.benchmark with changing input shapes"):
        found = finding(findings, name)
        assert found.status == NOT_HERE and found.cost_s is None, name
    assert finding(findings, "environment").status == "fine"


@pytest.mark.cuda
def test_cuda_profile_checks_run_on_a_gpu():
    obs = observe_builtin(lambda: tiny_resnet(10), tiny_split(), recipe=Recipe(batch_size=8), device="cuda",
                          steps=6, flops=False)
    findings = run_checks(obs)
    assert obs.cuda_profile and "error" not in obs.cuda_profile
    assert finding(findings, "launch-bound steps").status != NOT_HERE
    assert finding(findings, "tensors created on the host and copied every step").status != NOT_HERE


def test_doctor_findings_go_into_the_ablation_report(tmp_path, fast_run):
    import dataclasses

    from trainfast.doctor import doctor

    obs = dataclasses.replace(fast_run, grads=["zeroed"], zero_grad_s=fast_run.step_s / 2)   # one problem to report
    (tmp_path / "report.md").write_text("# trainfast ablation report\n\ntable\n\n## Recommendation\n\nbaseline.\n")
    findings = doctor(obs, tmp_path, show=False)
    doctor(obs, tmp_path, show=False)                          # a second run replaces the section
    text = (tmp_path / "report.md").read_text()
    assert text.count("## Doctor") == 1 and text.index("## Doctor") < text.index("## Recommendation")
    problems = [f for f in findings if f.status == "problem"]
    assert problems and all(f"**{f.name}**" in text for f in problems)


def test_cuda_and_compile_checks_read_their_evidence():
    """The CUDA-only and compile checks' logic, on observations as a GPU run would have them."""
    env = collect_environment()
    base = dict(step_seconds=[0.010] * 4, data_wait_s=[0.0] * 4)
    idle = Observations("built-in", "cuda:0", env, **base,
                        cuda_profile={"kernel_s_per_step": 0.002, "h2d_per_step": 3.0, "batch_tensors": 0})
    findings = run_checks(idle)
    assert bound(idle) == "launch-bound"
    launch = finding(findings, "launch-bound steps")
    assert launch.status == "problem" and launch.cost_s == pytest.approx(0.008)
    assert finding(findings, "tensors created on the host and copied every step").status == "problem"
    busy = Observations("built-in", "cuda:0", env, **base,
                        cuda_profile={"kernel_s_per_step": 0.009, "h2d_per_step": 0.0, "batch_tensors": 0})
    assert finding(run_checks(busy), "launch-bound steps").status == "fine"
    assert finding(run_checks(busy), "tensors created on the host and copied every step").status == "fine"
    name = "compile: graph breaks and recompilations"
    broken = Observations("built-in", "cpu", env, compiled=True, recompiles=0,
                          compile={"graphs": 2, "graph_breaks": 1, "break_reasons": ["Tensor.item() call"]})
    assert finding(run_checks(broken), name).status == "problem"
    assert "Tensor.item()" in finding(run_checks(broken), name).evidence
    clean = Observations("built-in", "cpu", env, compiled=True, recompiles=0,
                         compile={"graphs": 1, "graph_breaks": 0, "break_reasons": []})
    assert finding(run_checks(clean), name).status == "fine"


def test_device_failures_are_explained_in_words():
    from trainfast.envcheck import explain_failure, no_gpu_reason

    cudnn = explain_failure(RuntimeError("cuDNN error: CUDNN_STATUS_NOT_INITIALIZED"), torch.device("cuda", 0))
    assert "cuDNN failed" in cudnn and "driver" in cudnn
    old = explain_failure(RuntimeError("CUDA driver version is insufficient for CUDA runtime version"),
                          torch.device("cuda", 0))
    assert "does not support this build" in old
    assert "hides every GPU" in no_gpu_reason({"cuda_build": "12.4", "cuda_visible_devices": "", "driver": "550.1"})
    assert "CPU-only build" in no_gpu_reason({"cuda_build": None, "cuda_visible_devices": None})
    assert "no NVIDIA driver" in no_gpu_reason({"cuda_build": "12.4", "cuda_visible_devices": None, "driver": None})
