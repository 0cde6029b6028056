"""Every script under benchmarks/ still starts against the current package: `--help` imports what it imports at the
top and parses its flags (a renamed function in trainfast would otherwise surface only when someone measures)."""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
SCRIPTS = sorted((ROOT / "benchmarks").glob("*.py")) + sorted((ROOT / "benchmarks" / "peers").glob("*.py"))


# Every script's `--help` in one interpreter (torch imported once, not once per script), each as `python
# script.py --help` runs it: as __main__, with its own folder first on the path and --help its only argument.
HELP_ALL = r"""
import contextlib, io, json, runpy, sys, traceback
from pathlib import Path

results = {}
for path in sys.argv[1:]:
    out, err = io.StringIO(), io.StringIO()
    saved_path, saved_argv = list(sys.path), list(sys.argv)
    sys.path.insert(0, str(Path(path).parent))
    sys.argv = [path, "--help"]
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            runpy.run_path(path, run_name="__main__")
        code = 0
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        code = 1
        err.write(traceback.format_exc())
    finally:
        sys.path[:], sys.argv = saved_path, saved_argv
    results[path] = {"code": code, "out": out.getvalue(), "err": err.getvalue()[-2000:]}
print(json.dumps(results))
"""


@pytest.fixture(scope="module")
def helps() -> dict[str, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", HELP_ALL, *map(str, SCRIPTS)], env=env, capture_output=True,
                          text=True, timeout=600, cwd=ROOT)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return json.loads(proc.stdout.strip().splitlines()[-1])


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: str(p.relative_to(ROOT / "benchmarks")))
def test_the_script_starts(script, helps):
    ran = helps[str(script)]
    assert ran["code"] == 0, ran["err"]
    assert "usage" in ran["out"].lower()


def test_peers_compares_the_same_switches_and_images():
    """timm's own train.py and trainfast get the same model, batch, workers and switches, and every tool is
    credited with the images it trains (full batches only)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    out, data = Path("/x/out"), Path("/x/data")
    timm = peers.command("timm-cl", "r18-128", data, 3, out, None, "bf16", Path("/t/train.py"))
    ours = peers.command("trainfast-pf-cl", "r18-128", data, 3, out, None, "bf16")
    assert timm[1] == "/t/train.py" and "--channels-last" in timm and "--channels-last" in ours
    assert "--no-prefetcher" not in timm and "--prefetch" in ours      # timm's prefetcher is on by default
    assert "--prefetch" not in peers.command("trainfast-cl", "r18-128", data, 3, out, None, "bf16")
    assert timm[timm.index("--amp-dtype") + 1] == "bfloat16" and ours[ours.index("--precision") + 1] == "bf16"
    assert timm[timm.index("-b") + 1] == ours[ours.index("--batch-size") + 1] == "128"
    assert timm[timm.index("--workers") + 1] == ours[ours.index("--num-workers") + 1] == "2"
    assert "--channels-last" not in peers.command("timm", "r18-128", data, 3, out, None, "bf16", Path("/t/train.py"))
    assert peers.images_per_epoch("r18-128", 1596) == 1536


def test_peers_calls_a_difference_inside_the_noise_that_and_a_clear_one_faster():
    """The same-switch verdicts pair each round, pool the noise over every tool, and name the peer compared."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    jitter = [1.00, 1.06, 0.95]                       # a shared VM's rounds: every tool moves together, plus noise
    per_epoch = {"timm": [20.0 * j for j in jitter],
                 "trainfast-pf": [19.6 * j * k for j, k in zip(jitter, (1.04, 0.97, 1.0))],
                 "timm-cl": [19.0 * j * k for j, k in zip(jitter, (1.0, 1.02, 0.97))],
                 "trainfast-pf-cl": [14.0 * j * k for j, k in zip(jitter, (0.99, 1.01, 1.0))]}
    verdicts = {(v["tool"], v["peer"]): v for v in peers.same_switch_verdicts(per_epoch, 1536)}
    assert set(verdicts) == {("trainfast-pf", "timm"), ("trainfast-pf-cl", "timm-cl")}     # lightning not run
    assert verdicts["trainfast-pf", "timm"]["verdict"] == "no measurable difference"
    assert verdicts["trainfast-pf-cl", "timm-cl"]["verdict"] == "faster"
    assert verdicts["trainfast-pf-cl", "timm-cl"]["per_round"][0] == pytest.approx(19.0 / (14.0 * 0.99))


def test_peers_counts_the_cpu_of_a_tools_workers(tmp_path):
    """run_once's CPU seconds include the children the tool waited for (its loader workers), so the busy share
    of an epoch is the whole process tree's, not the training process's alone."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    parent = ("import multiprocessing as mp, time\n"
              "def burn():\n"
              "    t = time.process_time()\n"
              "    while time.process_time() - t < 0.4:\n"
              "        pass\n"
              "if __name__ == '__main__':\n"
              "    worker = mp.get_context('fork').Process(target=burn)\n"
              "    worker.start()\n"
              "    worker.join()\n")
    script = tmp_path / "tool.py"
    script.write_text(parent)
    seconds, accuracy, epochs, cpu, marks = peers.run_once([sys.executable, str(script)], "plain",
                                                           tmp_path / "log.txt")
    assert accuracy is None and epochs == [] and marks == []
    assert cpu >= 0.35                                  # the worker's 0.4 s of CPU, counted through its parent
    assert peers.busy_fraction(cpu, seconds, cores=1) == pytest.approx(cpu / seconds)
    assert peers.busy_fraction(3.0, 2.0, cores=2) == 0.75


TIMM_LIKE = """
import json, sys, time
for epoch in range(3):
    print(f"Train: {epoch} [   0/12 (  8%)]  Loss: 1.40", file=sys.stderr, flush=True)
    time.sleep(0.3)
    print("Test: [   0/1]  Time: 0.7", file=sys.stderr, flush=True)
    print("Test: [   1/1]  Time: 0.1", file=sys.stderr, flush=True)
    print("Current checkpoints:", file=sys.stderr, flush=True)
    time.sleep(0.2)
print("*** Best metric: 40.0 (epoch 2)", file=sys.stderr, flush=True)
"""
OURS_LIKE = """
import time
for epoch in range(3):
    time.sleep(0.5)
    print(f"epoch {epoch + 1}: train loss 1.0  val acc 0.5  0.5s", flush=True)
print("run folder: out/", flush=True)
"""
LIGHTNING_LIKE = """
import json, time
for epoch in range(3):
    time.sleep(0.5)
    print(json.dumps({"epoch": epoch + 1, "epoch_time_s": 0.5}), flush=True)
print(json.dumps({"val_accuracy": 0.5}), flush=True)
"""


@pytest.mark.parametrize("source", [TIMM_LIKE, OURS_LIKE, LIGHTNING_LIKE], ids=["timm", "trainfast", "lightning"])
def test_peers_reads_each_epochs_end_from_the_lines_as_they_arrive(tmp_path, source):
    """The per-epoch cost inside one run: an epoch's end found in what each tool prints (timm's train.py: its
    evaluation's last line; trainfast: its epoch line), stamped when it arrived, so 3 epochs of 0.5 s read as
    3 marks 0.5 s apart (not all at exit, as a buffered pipe would show)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    script = tmp_path / "tool.py"
    script.write_text(source)
    *_, marks = peers.run_once([sys.executable, str(script)], "plain", tmp_path / "log.txt")
    assert len(marks) == 3
    assert peers.in_run_epoch(marks) == pytest.approx(0.5, abs=0.15)
    assert peers.in_run_epoch(marks[:1]) is None


def test_peers_runs_each_same_switch_pair_side_by_side_and_alternates_who_goes_first():
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    tools = ["timm", "timm-cl", "lightning", "lightning-cl", "trainfast", "trainfast-cl", "trainfast-pf",
             "trainfast-pf-cl", "tuned"]
    orders = [peers.round_order(tools, r) for r in range(4)]
    for order in orders:
        assert sorted(order) == sorted(tools)                  # every tool once a round
        for mine, peer in (("trainfast-pf", "timm"), ("trainfast-pf-cl", "timm-cl"), ("trainfast", "lightning"),
                           ("trainfast-cl", "lightning-cl")):
            assert abs(order.index(mine) - order.index(peer)) == 1, (mine, peer, order)
    assert orders[0].index("timm") < orders[0].index("trainfast-pf")
    assert orders[1].index("timm") > orders[1].index("trainfast-pf")       # who goes first alternates
    assert len({order[0] for order in orders}) == 4                           # no tool always first
    assert peers.round_order(["plain", "tuned"], 1) == ["tuned", "plain"]     # unpaired tools rotate as before


def test_process_spread_finds_the_state_that_follows_a_runs_speed(tmp_path, capsys):
    """Within each rung, the runs that fault more pages per step are the slower ones: the rank correlation says so
    (and a state that does not move within a rung is said to have no spread)."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import process_spread

    rungs = []
    for name, base in (("baseline", 1000.0), ("amp", 1500.0)):
        runs = []
        for faults, slow in ((4000, 1.0), (5000, 0.95), (3000, 1.04), (6000, 0.9)):
            runs.append({"throughput": base * slow, "steps_run": 10,
                         "process": {"minor_faults": faults * 10, "preempted": 50, "anon_huge_kib": 0,
                                     "busy_threads": [{"cpu_s": 2, "core": 0}, {"cpu_s": 2, "core": 1}]}})
        rungs.append({"name": name, "runs": runs})
    folder = tmp_path / "ablate-x"
    folder.mkdir()
    (folder / "results.json").write_text(json.dumps({"rungs": rungs}))
    assert process_spread.main([str(folder)]) == 0
    out = capsys.readouterr().out
    rho = float(re.search(r"page faults per step: rho ([-+0-9.]+)", out).group(1))
    assert rho < -0.9
    assert "huge pages KiB: no spread within the rungs" in out and "8 runs of 2 rungs" in out


def test_peers_quick_mode_runs_once_per_tool_and_compares_the_recipe_with_every_peer(tmp_path):
    """--epochs N: one run per tool and round (the quick GPU mode); trainfast's recipe is set against every peer,
    whatever switches the peer runs, on its steady epochs and whole process; an interval only from 3 rounds."""
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import peers

    assert peers.parse_epochs("3") == (None, 3) and peers.parse_epochs("1,3") == (1, 3)
    for bad in ("1", "3,1", "x"):
        with pytest.raises(SystemExit):
            peers.parse_epochs(bad)
    assert peers.run_lengths(None, 3, 1) == (3,) and peers.run_lengths(1, 3, 1) == (3, 1)
    in_run = {"timm-tc-cl": [4.0], "tuned": [2.5]}
    whole = {"timm-tc-cl": [130.0], "tuned": [100.0]}
    [pair] = peers.recipe_against(in_run, whole, 7680)
    assert pair["peer"] == "timm-tc-cl" and pair["steady_epoch_speedup"] == [pytest.approx(1.6)]
    assert pair["whole_process_speedup"] == [pytest.approx(1.3)] and "without an interval" in pair["text"]
    three = peers.recipe_against({"timm-tc-cl": [4.0, 4.2, 3.9], "tuned": [2.5, 2.6, 2.4]},
                                 {"timm-tc-cl": [130.0] * 3, "tuned": [100.0] * 3}, 7680)[0]
    assert "faster" in three["text"]
    recipe = tmp_path / "r.yaml"
    recipe.write_text("precision: bf16\ndecode_cache: true\n")
    assert peers.builds_cache(recipe) and not peers.builds_cache(None)


def test_the_quick_scripts_best_recipe_takes_device_decoding_only_where_it_was_faster(tmp_path):
    sys.path.insert(0, str(ROOT / "benchmarks"))
    import gpu_summary
    import yaml

    base = tmp_path / "fast.yaml"
    base.write_text("precision: bf16\nchannels_last: true\n")
    for verdict, status, expected in (("faster by 31%", "done", True), ("no measurable difference", "done", False),
                                      (None, "no-effect", False)):
        (tmp_path / "results.json").write_text(json.dumps({"rungs": [
            {"name": "baseline", "status": "done", "verdict": "reference"},
            {"name": "device_decode", "status": status, "verdict": verdict}]}))
        said = gpu_summary.best_recipe(tmp_path, base, True, tmp_path / "best.yaml")
        best = yaml.safe_load((tmp_path / "best.yaml").read_text())
        assert best == {"precision": "bf16", "channels_last": True, "device_decode": expected, "compile": True}, said
    said = gpu_summary.best_recipe(tmp_path / "missing", base, False, tmp_path / "best.yaml")
    assert "no result" in said and yaml.safe_load((tmp_path / "best.yaml").read_text())["device_decode"] is False


@pytest.mark.slow
def test_the_quick_gpu_script_runs_every_step_in_its_cpu_smoke_mode(tmp_path):
    """SMOKE=1 benchmarks/gpu_quick.sh: the GPU call's every step (JPEGs, the decode pair, the peers, the compiled
    pair's recipe, the table) on the CPU, small, so the script is known to work before a GPU is lent. Without
    compile the compiled pair would be the decode pair's ablation again: its recipe is written and read back, the
    ablation not rerun, and the table says it has no results for it."""
    out = tmp_path / "out"
    env = {**os.environ, "SMOKE": "1", "PYTHON": sys.executable, "TRAINFAST_CACHE": str(tmp_path / "cache")}
    proc = subprocess.run(["bash", str(ROOT / "benchmarks" / "gpu_quick.sh"), "-", str(out)], env=env,
                          capture_output=True, text=True, timeout=900)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    summary = (out / "summary.md").read_text()
    for step in ("jpegs", "decode", "peers", "decode-compiled"):
        assert re.search(rf"^- {step}: \d+ \(exit 0\) s wall$", summary, re.MULTILINE), summary
    assert "1. device decoding on the fast recipe" in summary
    assert "not rerun; its recipe: False False" in proc.stdout                 # compile off, device_decode off
    assert re.search(r"^### 3\. .* with compile\n\nno results", summary, re.MULTILINE), summary
    assert "no effect on this device" in summary                  # device decoding on a CPU: said, not timed
    assert "trainfast's recipe against plain" in summary
    decode = json.loads((out / "decode-results.json").read_text())
    baseline = next(r for r in decode["rungs"] if r["name"] == "baseline")
    assert baseline["status"] == "done" and baseline["step_alone"] > 0 and baseline["epoch_of_step"] > 0
    peers_run = json.loads((out / "peers.json").read_text())["workloads"]["r18-32"]
    assert set(peers_run["median_whole_process_s"]) == {"plain", "tuned"}
    assert peers_run["recipe_against"][0]["peer"] == "plain"
