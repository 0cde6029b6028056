"""`trainfast selfcheck`: every judge on made-up numbers (a pass and a fail each), the no-CUDA refusal, the
--cpu-subset run end to end, selfcheck.json, and the DDP worker over gloo. The CUDA runs are marked."""
from __future__ import annotations

import argparse
import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from trainfast import selfcheck
from trainfast.selfcheck import catalog, judges, runner
from trainfast.selfcheck.judges import (judge_close, judge_compile, judge_flagged, judge_gain, judge_host_blocking,
                                        judge_jpeg, judge_masters, judge_nonfinite_stop, judge_overlap, judge_parity,
                                        judge_peaks, judge_reduced, judge_rung_measured, judge_scaler, judge_set_epoch,
                                        judge_wait)

ROOT = Path(__file__).resolve().parents[1]


def parse(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="trainfast")
    sub = parser.add_subparsers(dest="command", required=True)
    selfcheck.add_parser(sub)
    return parser.parse_args(["selfcheck", *argv])


# --- the judges ------------------------------------------------------------------------------------------

CPU = {"cuda": False, "gpus": 0, "bf16": True, "compiler": True}
ONE_GPU = {"cuda": True, "gpus": 1, "bf16": False, "compiler": True}


@pytest.mark.parametrize("needs, machine, cpu_subset, expect", [
    ({}, CPU, True, None),
    ({"cuda": True}, CPU, True, "needs CUDA"),
    ({"cuda": True}, ONE_GPU, False, None),
    ({"cuda": True}, ONE_GPU, True, "needs CUDA (--cpu-subset runs on the CPU)"),
    ({"cuda": True, "gpus": 2}, ONE_GPU, False, "1 GPU"),
    ({"bf16": True}, ONE_GPU, False, "no bf16 support on this GPU"),
    ({"bf16": True}, CPU, True, None),
    ({"compiler": True}, {**CPU, "compiler": False}, True, "no C++ compiler: inductor cannot build kernels here"),
])
def test_applicable_says_why_a_check_cannot_run(needs, machine, cpu_subset, expect):
    assert judges.applicable(needs, machine, cpu_subset) == expect


LEARNING = [2.0, 1.5, 1.0, 0.8, 0.6, 0.5, 0.5, 0.5]


def test_parity_passes_within_tolerance_and_fails_outside_it():
    assert judge_parity(LEARNING, [v * 1.02 for v in LEARNING], 0.05).ok
    far = judge_parity(LEARNING, [v * 1.2 for v in LEARNING], 0.05)
    assert not far.ok and far.figure == pytest.approx(0.2)


def test_parity_fails_on_a_reference_that_did_not_learn_and_on_a_nan():
    flat = [1.0] * 8
    assert "did not learn" in judge_parity(flat, flat, 0.05).detail and not judge_parity(flat, flat, 0.05).ok
    nan = judge_parity(LEARNING, LEARNING[:3] + [float("nan")] + LEARNING[4:], 0.05)
    assert not nan.ok and "step 3" in nan.detail


def scaler_trace(inf_step: int = 3, regrow: bool = True, moved_at_inf: bool = False):
    scales = [256.0, 256.0, 256.0, 128.0, 128.0, 256.0 if regrow else 128.0]
    changed = [True] * 6
    changed[inf_step] = moved_at_inf
    return scales, changed


def test_scaler_passes_when_the_inf_step_is_skipped_backed_off_and_regrown():
    scales, changed = scaler_trace()
    verdict = judge_scaler(scales, changed, 3, skipped=1)
    assert verdict.ok and verdict.figure == 2.0, verdict


@pytest.mark.parametrize("trace, skipped, words", [
    (scaler_trace(regrow=False), 1, "never grew back"),
    (scaler_trace(moved_at_inf=True), 1, "still moved the weights"),
    (scaler_trace(), 0, "0 skipped step(s) counted"),
    (([256.0, 256.0, 256.0, 256.0, 256.0, 512.0], [True, True, True, False, True, True]), 1, "not x0.5"),
])
def test_scaler_fails_on_each_broken_part(trace, skipped, words):
    verdict = judge_scaler(*trace, 3, skipped=skipped)
    assert not verdict.ok and words in verdict.detail, verdict


def test_masters_pass_and_fail():
    assert judge_masters(["float16", "float32"], ["float32"], 0.0).ok
    assert not judge_masters(["float16"], ["float16"], 0.0).ok                  # no fp32 master
    assert not judge_masters(["float32"], ["float32"], 0.0).ok                  # no half weights
    assert not judge_masters(["float16"], ["float32"], 1e-3).ok                 # copy-back lost
    assert not judge_masters(["float16", "float16"], ["float32"], 0.0).ok       # a master missing


def test_host_blocking_judges_non_blocking_against_its_blocking_control():
    assert judge_host_blocking(0.0001, 0.004, 0.004, 0.004).ok
    blocked = judge_host_blocking(0.003, 0.004, 0.004, 0.004)
    assert not blocked.ok and blocked.figure == pytest.approx(0.75)
    blind = judge_host_blocking(0.0001, 0.004, 0.0001, 0.004)                   # the control did not block
    assert not blind.ok and "control" in blind.detail


def test_overlap_passes_when_the_copy_is_hidden_and_fails_when_serial():
    hidden = judge_overlap(serial_s=0.020, overlapped_s=0.011, copy_s=0.010, compute_s=0.010)
    assert hidden.ok and hidden.figure == pytest.approx(0.9)
    serial = judge_overlap(serial_s=0.020, overlapped_s=0.019, copy_s=0.010, compute_s=0.010)
    assert not serial.ok and serial.figure == pytest.approx(0.1)
    no_baseline = judge_overlap(serial_s=0.011, overlapped_s=0.010, copy_s=0.010, compute_s=0.010)
    assert not no_baseline.ok and "nothing to compare" in no_baseline.detail


def test_the_wait_on_the_device_timeline_passes_and_fails_both_ways():
    # pageable memory, compute-bound: the host's clock said 55% waiting, the device idled 5%
    fed = judge_wait(wait=0.05, copy=0.11, host=0.55, planted=False)
    assert fed.ok and "host's time in next() 55%" in fed.detail
    fooled = judge_wait(wait=0.55, copy=0.0, host=0.55, planted=False)
    assert not fooled.ok and "compute counted as waiting" in fooled.detail
    assert judge_wait(wait=0.92, copy=0.01, host=0.92, planted=True).ok
    missed = judge_wait(wait=0.05, copy=0.0, host=0.90, planted=True)
    assert not missed.ok and "planted loader was not seen" in missed.detail


def test_gain_pass_and_fail():
    assert judge_gain(0.012, 0.010, 1.05, "channels_last").figure == pytest.approx(1.2)
    assert judge_gain(0.012, 0.010, 1.05, "channels_last").ok
    assert not judge_gain(0.010, 0.010, 1.05, "channels_last").ok
    assert not judge_gain(0.0, 0.010, 1.0, "x").ok


def test_flagged_needs_the_planted_case_flagged_and_the_control_clean():
    assert judge_flagged("problem", "fine", "syncs").ok
    assert not judge_flagged("fine", "fine", "syncs").ok             # the mistake went unseen
    assert not judge_flagged("problem", "problem", "syncs").ok       # flags everything: proves nothing
    assert not judge_flagged("not checked here", "fine", "syncs").ok
    # where the device makes the mistake harmless (host reads on the CPU) the doctor must still count it
    assert judge_flagged("measured", "fine", "syncs", expect="measured").ok
    assert not judge_flagged("fine", "fine", "syncs", expect="measured").ok
    assert not judge_flagged("measured", "measured", "syncs", expect="measured").ok
    assert not judge_flagged("problem", "fine", "syncs", expect="measured").ok


def test_compile_pass_and_each_failure():
    eager = [1.0, 0.9, 0.8]
    assert judge_compile(eager, [1.0, 0.9000001, 0.8], frames=1, breaks=0, recompiles=0).ok
    for kwargs, words in (({"frames": 0}, "0 frames"), ({"breaks": 2}, "2 graph break"),
                          ({"recompiles": 1}, "1 recompile")):
        verdict = judge_compile(eager, eager, **{"frames": 1, "breaks": 0, "recompiles": 0, **kwargs})
        assert not verdict.ok and words in verdict.detail
    assert not judge_compile(eager, [1.0, 0.95, 0.8], frames=1, breaks=0, recompiles=0).ok


def test_close_pass_fail_and_nan():
    assert judge_close(1e-7, 1e-5, "w").ok
    assert not judge_close(1e-3, 1e-5, "w").ok
    assert not judge_close(float("nan"), 1e-5, "w").ok


def test_jpeg_pass_and_fail():
    assert judge_jpeg([3, 8, 8], [3, 8, 8], "cuda:0", 0.7).ok
    assert not judge_jpeg([3, 8, 8], [3, 8, 8], "cuda:0", 5.0).ok
    assert not judge_jpeg([3, 8, 8], [3, 8, 9], "cuda:0", 0.0).ok
    assert not judge_jpeg([3, 8, 8], [3, 8, 8], "cpu", 0.0).ok


def test_set_epoch_pass_and_both_failures():
    good = [[[0, 2], [4, 0]], [[1, 3], [2, 5]]]          # rank -> epoch -> indices
    assert judge_set_epoch(good).ok
    overlapping = [[[0, 2], [4, 0]], [[2, 3], [1, 5]]]
    assert "same samples" in judge_set_epoch(overlapping).detail and not judge_set_epoch(overlapping).ok
    repeated = [[[0, 2], [0, 2]], [[1, 3], [1, 3]]]
    assert "set_epoch" in judge_set_epoch(repeated).detail and not judge_set_epoch(repeated).ok


def test_reduced_metrics_pass_only_when_every_rank_logs_the_mean_over_ranks():
    local = [[1.0, 2.0, 3.0, 4.0], [3.0, 4.0, 5.0, 6.0]]
    reduced = [[2.5, 4.5], [2.5, 4.5]]                    # windows of 2, averaged, then over ranks
    assert judge_reduced(local, reduced, every=2).ok
    unreduced = [[1.5, 3.5], [3.5, 5.5]]                 # each rank logged its own windows
    assert not judge_reduced(local, unreduced, every=2).ok
    assert not judge_reduced(local, [[2.5], [2.5]], every=2).ok


def test_nonfinite_stop_pass_and_fail():
    stop = "NonFiniteLossError: loss is nan on rank(s) 1 at step 4 (policy nonfinite=stop)"
    other = "NonFiniteLossError: loss is not finite at step 4 (policy nonfinite=stop)"
    assert judge_nonfinite_stop([other, stop], 2).ok
    assert not judge_nonfinite_stop([other.replace("4", "6"), stop], 2).ok       # different steps
    assert not judge_nonfinite_stop([None, stop], 2).ok                          # rank 0 went on
    assert not judge_nonfinite_stop([stop], 2).ok                                # a rank missing


def rung(name, status="done", effect="measured", speedup=1.1, peak=2**28):
    return {"name": name, "status": status, "effect": effect, "speedup": speedup, "peak_memory_bytes": peak,
            "reason": ""}


def test_rung_measured_pass_and_fail():
    assert judge_rung_measured([rung("baseline"), rung("non_blocking")], "non_blocking").ok
    ruled_out = [rung("baseline"), rung("non_blocking", status="no-effect", effect="no-effect", speedup=None)]
    assert not judge_rung_measured(ruled_out, "non_blocking").ok
    assert not judge_rung_measured([rung("baseline")], "non_blocking").ok


def test_peaks_pass_and_fail():
    assert judge_peaks([rung("baseline", peak=3 * 2**28), rung("amp", peak=2**28)]).ok
    assert not judge_peaks([rung("baseline"), rung("amp")]).ok                   # one number copied everywhere
    assert not judge_peaks([rung("baseline"), rung("amp", peak=None)]).ok
    assert not judge_peaks([rung("baseline")]).ok


# --- the catalog and the command line --------------------------------------------------------------------

def test_catalog_names_are_unique_and_every_runner_resolves():
    assert len(set(catalog.NAMES)) == len(catalog.NAMES)
    for check in catalog.CHECKS:
        assert callable(check.resolve()), check.name
    cpu = {c.name for c in catalog.CHECKS if c.cpu}
    assert {"fp16_scaler", "bf16_o1_parity", "compile", "fused_adamw", "doctor_syncs"} <= cpu
    assert not cpu & {"non_blocking", "prefetch_overlap", "ddp_nccl", "nvjpeg", "ablation_non_blocking"}


def test_the_module_and_its_parser_import_no_torch():
    code = ("import sys, argparse; import trainfast.selfcheck as s; p = argparse.ArgumentParser(); "
            "s.add_parser(p.add_subparsers()); p.format_help(); print('torch' in sys.modules)")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert out.stdout.strip() == "False", out.stderr


def test_parser_has_examples_and_refuses_an_unknown_check(capsys):
    parser = argparse.ArgumentParser(prog="trainfast")
    sub = parser.add_subparsers(dest="command")
    sc = selfcheck.add_parser(sub)
    assert "examples:" in sc.format_help() and "--cpu-subset" in sc.format_help()
    assert parse("--only", "fp16_scaler, compile").only == ["fp16_scaler", "compile"]
    with pytest.raises(SystemExit) as exc:
        parse("--only", "fp16_scaler,warp_drive")
    assert exc.value.code == 2
    assert "warp_drive" in capsys.readouterr().err


def test_without_cuda_it_prints_one_line_and_exits_non_zero(monkeypatch, tmp_path, capsys):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert selfcheck.main(parse("--out", str(tmp_path))) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1, err
    assert err[0].startswith("selfcheck: no CUDA device here (torch ") and "--cpu-subset" in err[0]
    assert not (tmp_path / "selfcheck.json").exists()


def test_only_writes_selfcheck_json(tmp_path):
    assert selfcheck.main(parse("--cpu-subset", "--only", "fp16_scaler,nvjpeg", "--out", str(tmp_path))) == 0
    report = json.loads((tmp_path / "selfcheck.json").read_text())
    assert report["format"] == "trainfast.selfcheck" and report["mode"] == "cpu-subset"
    by_name = {c["name"]: c for c in report["checks"]}
    assert list(by_name) == ["fp16_scaler", "nvjpeg"]
    assert by_name["fp16_scaler"]["status"] == "pass" and by_name["fp16_scaler"]["figure"] == 4.0
    assert by_name["nvjpeg"]["status"] == "not applicable" and by_name["nvjpeg"]["detail"].startswith("needs CUDA")
    assert report["summary"] == {"pass": 1, "fail": 0, "not applicable": 1} and report["exit_status"] == 0


def test_a_failing_or_crashing_check_fails_the_run(monkeypatch, tmp_path):
    def crash(ctx):
        raise RuntimeError("CUDA error: an illegal memory access\nmore")

    class Fake(catalog.Check):
        def resolve(self):
            return {"bad": lambda ctx: judges.Verdict(False, 0.3, "x", "too slow"), "crash": crash}[self.name]

    fakes = [Fake("bad", "fails", "x:y"), Fake("crash", "crashes", "x:y")]
    monkeypatch.setattr(catalog, "CHECKS", fakes)
    monkeypatch.setattr(catalog, "NAMES", ["bad", "crash"])
    assert selfcheck.main(parse("--cpu-subset", "--out", str(tmp_path))) == 1
    checks = json.loads((tmp_path / "selfcheck.json").read_text())["checks"]
    assert [c["status"] for c in checks] == ["fail", "fail"]
    assert checks[1]["detail"].startswith("error: RuntimeError: CUDA error: an illegal memory access (")


@pytest.mark.slow
def test_cpu_subset_end_to_end(tmp_path):
    """Every CPU check passes on this machine; every CUDA one is reported not applicable, with why."""
    assert selfcheck.main(parse("--cpu-subset", "--out", str(tmp_path))) == 0
    report = json.loads((tmp_path / "selfcheck.json").read_text())
    for check in report["checks"]:
        if check["cpu_subset"]:
            assert check["status"] == "pass", check
            assert check["detail"]
        else:
            assert check["status"] == "not applicable" and check["detail"].startswith("needs CUDA"), check
    assert [c["name"] for c in report["checks"]] == catalog.NAMES
    assert report["summary"]["fail"] == 0 and report["machine"]["device"] == "cpu"


@pytest.mark.slow
def test_ddp_worker_over_gloo(tmp_path):
    """The DDP checks' worker, launched as on GPUs but over gloo: shards, set_epoch, reduced logs, NaN stop."""
    from trainfast.selfcheck import parallel_checks

    ctx = runner.Context(torch.device("cpu"), tmp_path, {"gpus": 0})
    shards = parallel_checks.check_ddp(ctx)
    assert shards.ok and shards.figure == 2.0, shards
    stop = parallel_checks.check_ddp_nonfinite(ctx)
    assert stop.ok and stop.figure == parallel_checks.NAN_AT - 1, stop


@pytest.mark.cuda
@pytest.mark.slow
def test_cuda_device_checks(tmp_path):
    only = "non_blocking,prefetch_overlap,channels_last,cudnn_benchmark_fixed,nvjpeg,fp16_scaler,fused_adamw"
    code = selfcheck.main(parse("--only", only, "--out", str(tmp_path)))
    checks = json.loads((tmp_path / "selfcheck.json").read_text())["checks"]
    assert code == 0, [c for c in checks if c["status"] == "fail"]
