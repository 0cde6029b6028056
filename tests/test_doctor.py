"""trainfast doctor: every mistake is flagged in a tiny loop that has it and not in its corrected twin; an
input-bound run is called input-bound and a compute-bound one is not; the sync counter counts exactly; on a
machine without a GPU the CUDA-only checks say "not checked here"."""
import json
import sys
import time

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from conftest import tiny_resnet
from trainfast.checks import NOT_HERE, Observations, bound, run_checks
from trainfast.cli import main
from trainfast.data.datasets import Split, TensorImages
from trainfast.doctor import observe_builtin, observe_loop
from trainfast.envcheck import collect_environment
from trainfast.models import resnet9
from trainfast.recipe import Recipe
from trainfast.watch import SyncCounter, check_eval_dropout

MEAN, STD = (0.5, 0.5, 0.5), (0.25, 0.25, 0.25)


def finding(findings, name):
    return next(f for f in findings if f.name == name)


# --- the built-in run: input-bound or not, num_workers, zero_grad -------------------------------------

class SlowImages(TensorImages):
    """A dataset whose every sample takes `delay` seconds (a slow decode): 8 samples a batch make the loop
    wait about 8 x delay for each batch, many times the tiny model's step (even on a busy machine, where the
    model's step slows down and a sleep does not)."""

    def __init__(self, images, labels, delay: float) -> None:
        super().__init__(images, labels)
        self.delay = delay

    def __getitem__(self, index):
        time.sleep(self.delay)
        return super().__getitem__(index)


def tiny_split(delay: float = 0.0) -> Split:
    g = torch.Generator().manual_seed(0)
    images = torch.randint(0, 256, (256, 3, 16, 16), dtype=torch.uint8, generator=g)
    labels = torch.randint(0, 10, (256,), generator=g)
    make = (lambda x, y: SlowImages(x, y, delay)) if delay else TensorImages
    return Split(make(images[:192], labels[:192]), TensorImages(images[192:], labels[192:]), 10, MEAN, STD, 16, "tiny")


def observe(split: Split, widths=None, **recipe) -> Observations:
    make = (lambda: resnet9(10, widths=widths)) if widths else (lambda: tiny_resnet(10))
    return observe_builtin(make, split, recipe=Recipe(batch_size=8, **recipe), device="cpu", steps=8, flops=False)


@pytest.fixture(scope="module")
def slow_run() -> Observations:
    return observe(tiny_split(delay=0.01))


@pytest.fixture(scope="module")
def fast_run() -> Observations:
    # A model wide enough that its step dwarfs loading 8 tensor images in the training process (~1% of the
    # step here, against ~8% for tiny_resnet, whose step is a few milliseconds): genuinely compute-bound.
    return observe(tiny_split(), widths=(64, 128, 128, 256), set_to_none=True)


def test_input_bound_run_is_called_input_bound(slow_run):
    assert bound(slow_run) == "input-bound"
    assert slow_run.wait_share >= 0.2 and slow_run.replay_gain >= 0.05     # the replay measured the bound
    found = finding(run_checks(slow_run), "waiting for the next batch")
    assert found.status == "problem" and found.cost_s > 0 and "replaying one cached batch" in found.evidence


def test_compute_bound_run_is_not(fast_run):
    assert bound(fast_run) == "compute-bound"
    assert finding(run_checks(fast_run), "waiting for the next batch").status == "fine"


def test_num_workers_zero_flagged_only_when_the_wait_is_material(slow_run, fast_run):
    slow = finding(run_checks(slow_run), "num_workers=0")
    assert slow.status == "problem" and slow.fix == "--num-workers auto" and slow.cost_s > 0
    assert finding(run_checks(fast_run), "num_workers=0").status == "fine"      # 0 workers, fast data: fine


def test_num_workers_twin_is_not_flagged():
    obs = observe(tiny_split(delay=0.002), num_workers=2, persistent_workers=True)   # one worker start
    assert obs.num_workers == 2
    assert finding(run_checks(obs), "num_workers=0").status == "fine"


def test_builtin_zero_grad_flag_and_twin(slow_run, fast_run):
    flagged = finding(run_checks(slow_run), "zero_grad without set_to_none")   # the recipe's default: False
    assert flagged.status == "problem" and flagged.fix == "--set-to-none" and flagged.cost_s is not None
    assert finding(run_checks(fast_run), "zero_grad without set_to_none").status == "fine"


def test_builtin_loop_is_checked_and_fine(fast_run):
    findings = run_checks(fast_run)
    assert finding(findings, "evaluation builds an autograd graph").status == "fine"   # actually checked
    assert fast_run.eval_forwards == 2
    assert finding(findings, "dropout active in eval mode").status == "fine"
    syncs = finding(findings, "host-device syncs per step")
    assert syncs.status == "fine" and fast_run.user_syncs() == []
    # the Meter's one read per window: a tolist and an item every log_every (10) steps
    assert sum(s["calls"] for s in fast_run.syncs) / fast_run.sync_steps == pytest.approx(0.2)
    assert len(fast_run.step_seconds) >= 3 and len(fast_run.replay_step_seconds) == len(fast_run.step_seconds)


# --- own loops: syncs, eval graph, dropout, zero_grad, DataParallel --------------------------------------

class Net(nn.Module):
    def __init__(self, functional_dropout: bool = False) -> None:
        super().__init__()
        self.functional_dropout = functional_dropout
        self.fc1, self.fc2, self.drop = nn.Linear(8, 16), nn.Linear(16, 3), nn.Dropout(0.5)

    def forward(self, x):
        h = torch.relu(self.fc1(x))
        h = F.dropout(h, 0.5) if self.functional_dropout else self.drop(h)     # F.dropout's default: training=True
        return self.fc2(h)


def run_loop(model=None, *, reads: int = 0, evaluate: str | None = None, zero: str = "none", steps: int = 12):
    """A plain PyTorch loop: `reads` .item() calls per step, an evaluation forward every step ("graph": without
    no_grad, "inference": under inference_mode), zero_grad "none" (set_to_none) / "zeroed" / "never"."""
    model = model or Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(0)
    for _ in range(steps):
        x, y = torch.randn(4, 8, generator=g), torch.randint(0, 3, (4,), generator=g)
        if zero != "never":
            optimizer.zero_grad(set_to_none=zero == "none")
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        optimizer.step()
        for _ in range(reads):
            loss.item()
        if evaluate:
            model.eval()
            if evaluate == "graph":
                model(x)
            else:
                with torch.inference_mode():
                    model(x)
            model.train()


def loop_findings(**kwargs):
    obs = observe_loop(lambda: run_loop(**kwargs), steps=4, sync_steps=4)
    return obs, run_checks(obs)


def test_sync_counter_counts_exactly_two_item_calls_per_step():
    obs, findings = loop_findings(reads=2)
    assert obs.sync_steps == 4
    assert sum(s["calls"] for s in obs.user_syncs()) == 2 * 4
    assert all("loss.item()" in s["where"] and "test_doctor.py" in s["where"] for s in obs.user_syncs())
    assert finding(findings, "host-device syncs per step").status == "problem"
    _, twin = loop_findings(reads=0)
    assert finding(twin, "host-device syncs per step").status == "fine"


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
    assert check_eval_dropout(Net(), torch.randn(4, 8)) == {"max_diff": 0.0, "relative_diff": 0.0, "calls": []}
    _, findings = loop_findings(model=Net(functional_dropout=True))
    assert finding(findings, "dropout active in eval mode").status == "problem"
    _, twin = loop_findings(model=Net())
    assert finding(twin, "dropout active in eval mode").status == "fine"


def test_zero_grad_without_set_to_none_and_missing_zero_grad():
    _, findings = loop_findings(zero="zeroed")
    flagged = finding(findings, "zero_grad without set_to_none")
    assert flagged.status == "problem" and "set_to_none=True" in flagged.fix
    _, never = loop_findings(zero="never")
    assert "never called" in finding(never, "zero_grad without set_to_none").evidence
    _, twin = loop_findings(zero="none")
    assert finding(twin, "zero_grad without set_to_none").status == "fine"


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


# --- cudnn.benchmark shapes (the detection on CPU; the check itself acts on CUDA) ------------------------

def shapes_obs(device: str, shapes, benchmark: bool = True) -> Observations:
    return Observations("own loop", device, collect_environment(), shapes=shapes, cudnn_benchmark=benchmark)


def test_cudnn_benchmark_with_changing_shapes():
    varying = [[[8, 3, s, s]] for s in (16, 20, 24, 28)]
    fixed = [[[8, 3, 16, 16]]] * 6 + [[[3, 3, 16, 16]]]          # full batches and the last, short one
    name = "cudnn.benchmark with changing input shapes"
    assert finding(run_checks(shapes_obs("cuda:0", varying)), name).status == "problem"
    assert finding(run_checks(shapes_obs("cuda:0", fixed)), name).status == "fine"
    assert finding(run_checks(shapes_obs("cuda:0", varying, benchmark=False)), name).status == "fine"
    assert finding(run_checks(shapes_obs("cpu", varying)), name).status == NOT_HERE


# --- environment and the CUDA-only checks ---------------------------------------------------------------

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


@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_profile_checks_run_on_a_gpu():
    obs = observe_builtin(lambda: tiny_resnet(10), tiny_split(), recipe=Recipe(batch_size=8), device="cuda",
                          steps=6, flops=False)
    findings = run_checks(obs)
    assert obs.cuda_profile and "error" not in obs.cuda_profile
    assert finding(findings, "launch-bound steps").status != NOT_HERE
    assert finding(findings, "tensors created on the host and copied every step").status != NOT_HERE


# --- the command ------------------------------------------------------------------------------------------

def test_doctor_command_writes_doctor_json(tmp_path, capsys):
    out = tmp_path / "doc"
    assert main(["doctor", "--image-size", "8", "--batch-size", "8", "--log-every", "4", "--steps", "3",
                 "--out", str(out)]) == 0
    data = json.loads((out / "doctor.json").read_text())
    names = [f["name"] for f in data["findings"]]
    assert "environment" in names and "zero_grad without set_to_none" in names
    statuses = [f["status"] for f in data["findings"]]
    assert statuses == sorted(statuses, key=["problem", "measured", "fine", NOT_HERE].index)   # ranked
    assert "problem(s)" in capsys.readouterr().out


def test_doctor_refuses_bad_flags_before_work(capsys):
    with pytest.raises(SystemExit) as exc:
        main(["doctor", "--steps", "0"])
    assert exc.value.code == 2
    assert main(["doctor", "--model", "no_such_model_xyz"]) == 2
    if not torch.cuda.is_available():                      # refused with the reason, not a stack trace
        assert main(["doctor", "--device", "cuda"]) == 2
        assert "torch sees no GPU: " in capsys.readouterr().err


SCRIPT = """
import torch, torch.nn.functional as F
model = torch.nn.Linear(8, 3)
optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
for step in range(1000):
    x, y = torch.randn(4, 8), torch.randint(0, 3, (4,))
    optimizer.zero_grad()
    loss = F.cross_entropy(model(x), y)
    loss.backward()
    optimizer.step()
    print(f"step {step} loss {loss.item():.3f}")
"""


def test_doctor_on_a_script(tmp_path):
    script = tmp_path / "train.py"
    script.write_text(SCRIPT)
    out = tmp_path / "doc"
    assert main(["doctor", "--steps", "4", "--log-every", "4", "--out", str(out), "--", sys.executable, str(script)]) == 0
    data = json.loads((out / "doctor.json").read_text())
    syncs = next(f for f in data["findings"] if f["name"] == "host-device syncs per step")
    assert syncs["status"] == "problem" and "loss.item()" in syncs["evidence"]
    assert data["observations"]["steps_run"] == 1 + 4 + 4          # stopped after its steps (4 watched: --log-every)


def test_doctor_findings_go_into_the_ablation_report(tmp_path, fast_run):
    import dataclasses

    from trainfast.doctor import doctor

    obs = dataclasses.replace(fast_run, grads=["zeroed"], zero_grad_s=0.001)      # one problem to report
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


def test_own_loop_data_wait_from_its_dataloader():
    from torch.utils.data import DataLoader, TensorDataset

    class Slow(TensorDataset):
        def __getitem__(self, index):
            time.sleep(0.01)
            return super().__getitem__(index)

    data = Slow(torch.randn(64, 8), torch.randint(0, 3, (64,)))
    model = Net()
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)

    def loop():
        for _ in range(10):
            for x, y in DataLoader(data, batch_size=4):
                optimizer.zero_grad()
                F.cross_entropy(model(x), y).backward()
                optimizer.step()

    obs = observe_loop(loop, steps=4, sync_steps=2)
    assert obs.num_workers == 0 and obs.samples == [4] * len(obs.samples)
    assert obs.wait_share >= 0.2 and bound(obs) == "input-bound"        # no replay for an own loop: the wait alone
    assert finding(run_checks(obs), "num_workers=0").status == "problem"
    # the model's FLOPs on a copy: forward 2x8x16 + 2x16x3 = 352 per sample; backward 448 (fc2's input and
    # weight gradients, fc1's weight gradient: its input needs none)
    assert obs.flops_per_sample == 800 and obs.ceiling_flops > 0
    assert finding(run_checks(obs), "compute throughput vs matmul peak").status == "measured"


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


def test_a_failing_hook_never_breaks_the_loop(monkeypatch):
    import trainfast.watch

    def fails(module):          # as inspecting a model split over devices might
        raise RuntimeError("expected all tensors to be on the same device")

    monkeypatch.setattr(trainfast.watch, "grads_state", fails)
    obs = observe_loop(lambda: run_loop(), steps=4, sync_steps=2)
    assert obs.steps_run == 7 and any("failed and was skipped" in note for note in obs.notes)
    assert obs.grads == []          # so that check says "not checked here", not "fine"
