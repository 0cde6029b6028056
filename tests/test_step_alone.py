"""Each rung's step alone and the figures that must agree with each other on a row: the step alone scored
against the baseline's, the epoch's share of it and the note when the input holds the epoch; a wait that would
put the compute above the roof said; the fp32 roof of a conv net on CUDA is TF32's; and on a GPU `trainfast
ablate` with no flags runs a workload that keeps it busy."""
import re

import torch
from conftest import scored_rung
from torch import nn

from trainfast.ablation.scoring import score_rungs
from trainfast.measure import runs_tf32
from trainfast.report.notes import caveats, input_switches, roof_contradiction
from trainfast.report.table import Columns, headers, table_rows
from trainfast.results import RungResult


def with_step_alone(rung, rate: float, wait: float = 0.0, copy: float | None = None):
    for run in rung.repeats:
        run["step_alone"] = {"throughput": rate, "steps": 8, "seconds": 0.5}
        run["data_wait_fraction"], run["copy_fraction"] = wait, copy
    return rung


def test_the_step_alone_is_scored_against_the_baselines_and_the_epoch_against_it():
    base = with_step_alone(scored_rung("baseline", [1000] * 3, 0.9), 1250)
    amp = with_step_alone(scored_rung("amp", [1070] * 3, 0.9, precision="bf16"), 3250)
    score_rungs([base, amp], {"fp32": 1e12, "bf16": 1e12})
    assert base.result.step_alone == 1250 and base.result.step_alone_speedup == 1.0
    assert abs(amp.result.step_alone_speedup - 2.6) < 1e-9
    assert abs(amp.result.epoch_of_step - amp.result.throughput / 3250) < 1e-9
    row = table_rows([base, amp])[1]
    assert "3,250 (2.60x), epoch 33%" in row[headers().index("step alone (vs baseline's), epoch's share")]


def test_an_epoch_well_under_its_step_alone_is_said_to_be_held_by_its_input():
    base = with_step_alone(scored_rung("baseline", [1000] * 3, 0.9), 1050)
    amp = with_step_alone(scored_rung("amp", [1070] * 3, 0.9, precision="bf16"), 3250)
    score_rungs([base, amp], {"fp32": 1e12, "bf16": 1e12})
    settings = {"device": "cuda:0", "data": "imagefolder:/photos"}
    held = [c for c in caveats(amp, settings) if "input holds it" in c]
    assert held and re.search(r"step alone 3\.10x the baseline's, epoch 1\.\d\dx", held[0])   # epoch: noisy blocks
    assert "--decode-cache" in held[0] and "--pin-memory --non-blocking" in held[0] and "--prefetch" in held[0]
    assert not any("input holds it" in c for c in caveats(base, settings))       # 95% of its step alone


def test_the_input_switches_named_are_those_the_rung_lacks_and_that_act_here():
    from trainfast import Recipe

    cpu_digits = {"device": "cpu", "data": "digits"}
    assert input_switches(Recipe(), cpu_digits) == ["loader workers (--num-workers)", "the prefetcher (--prefetch)"]
    fed = Recipe(num_workers=8, prefetch=True, pin_memory=True, non_blocking=True, decode_cache=True)
    assert input_switches(fed, {"device": "cuda:0", "data": "imagefolder:/x"}) \
        == ["decoding on the device (--device-decode)"]
    assert input_switches(fed.replace(device_decode=True), {"device": "cuda:0", "data": "imagefolder:/x"}) == []
    assert input_switches(fed, {"device": "cuda:0", "data": "digits"}) == []     # nothing to decode in memory


def test_the_input_switches_named_are_the_declared_ones(monkeypatch):
    """The note's input switches are the rungs that declare a held_note, in its order: a new one is named where the
    rung's recipe lacks it, with no list in the report to edit."""
    from trainfast import Recipe, techniques
    from trainfast.techniques.switch import RungSpec

    declared = techniques.held_input_rungs()
    assert [r.name for r in declared] == ["workers", "decode_cache", "device_decode", "non_blocking", "prefetch"]
    new = RungSpec("set_to_none", {"set_to_none": True}, place=1, held_note=(0, "gradients set to None"))
    monkeypatch.setattr(techniques, "held_input_rungs", lambda: (new, *declared))
    cpu_digits = {"device": "cpu", "data": "digits"}
    assert input_switches(Recipe(), cpu_digits)[0] == "gradients set to None"
    assert "gradients set to None" not in input_switches(Recipe(set_to_none=True), cpu_digits)


def test_a_wait_that_leaves_the_compute_above_the_roof_is_said():
    # The row a host clock produced on a GPU: 75% waiting and 85% of the roof in the same row.
    contradiction = roof_contradiction(RungResult(data_wait_fraction=0.75, ceiling_fraction=0.848))
    assert contradiction and "339% of the peak" in contradiction
    assert roof_contradiction(RungResult(data_wait_fraction=0.01, copy_fraction=0.18, ceiling_fraction=0.11)) is None
    assert roof_contradiction(RungResult(data_wait_fraction=None, ceiling_fraction=0.5)) is None


def test_a_users_script_has_no_step_alone_column():
    assert "step alone (vs baseline's), epoch's share" not in headers(Columns.for_settings({"command": ["python"]}))


def test_an_fp32_conv_net_on_cuda_is_measured_against_the_tf32_roof():
    conv = nn.Sequential(nn.Conv2d(3, 64, 3), nn.Conv2d(64, 64, 3), nn.Flatten(), nn.LazyLinear(10))
    vit_like = nn.Sequential(nn.Conv2d(3, 8, 16, 16), nn.Flatten(), nn.Linear(8, 512), nn.Linear(512, 512))
    cuda = torch.device("cuda")
    kept = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32   # torch's flags, not attributes
    try:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = True, False
        assert runs_tf32(conv, cuda)                      # cuDNN convolutions run in TF32 by default
        assert not runs_tf32(vit_like, cuda)              # matmuls do not, unless asked
        assert not runs_tf32(conv, torch.device("cpu"))   # no TF32 on a CPU
        torch.backends.cuda.matmul.allow_tf32 = True
        assert runs_tf32(vit_like, cuda)
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = kept


def test_on_a_gpu_ablate_with_no_flags_runs_the_gpu_workload(monkeypatch, capsys):
    from trainfast.cli import parse_command_line, use_gpu_default
    from trainfast.tasks.classification import Classification

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    args = parse_command_line(["ablate"])
    use_gpu_default(args)
    assert (args.model, args.image_size, args.batch_size) == ("resnet50", 160, 256)
    assert args.switches == Classification.gpu_default["switches"] and "compile" not in args.switches
    assert "a GPU is here" in capsys.readouterr().err
    for flags in (["ablate", "--model", "resnet18"], ["ablate", "--batch-size", "32"], ["ablate", "--device", "cpu"],
                  ["ablate", "--", "python", "train.py"], ["tune"]):
        args = parse_command_line(flags)
        use_gpu_default(args)
        assert args.model in (None, "resnet18") and args.image_size is None, flags
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    args = parse_command_line(["ablate"])
    use_gpu_default(args)
    assert args.model is None                          # the CPU keeps its default
