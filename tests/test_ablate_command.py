"""`trainfast ablate -- COMMAND`: a user's own script, run once per rung with the rung's recipe in its
environment and measured by the probe (speed and full mode, a failing rung, a script without a Session, commands
refused before any run; a command's ranks under --nproc 2: test_ranks.py's shared ablation)."""
from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from trainfast.procs import read_log_tail

ROOT = Path(__file__).resolve().parents[1]
ADOPTED = str(ROOT / "examples" / "adopted_loop.py")


def ablate(out: Path, *flags: str, command: list[str], check: bool = True) -> tuple[subprocess.CompletedProcess, dict]:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "CUDA_VISIBLE_DEVICES": ""}
    env.pop("TRAINFAST_RECIPE", None)
    # the amp rung in bf16 on every CPU: auto would leave it out where no half type is fast (an AVX2-only CPU)
    flags = flags if "--amp-dtype" in flags else (*flags, "--amp-dtype", "bf16")
    # exactly the passes asked for: the settling passes (while a verdict is within the noise) are a timing matter,
    # tested on their own, and would add minutes to every end-to-end test here
    flags = flags if "--settle-within" in flags else (*flags, "--settle-within", "0")
    proc = subprocess.run([sys.executable, "-m", "trainfast", "ablate", "--out", str(out), *flags, "--", *command],
                          env=env, capture_output=True, text=True, timeout=900)
    if check:
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:] + run_logs(out)
    results = json.loads((out / "results.json").read_text()) if (out / "results.json").exists() else {}
    return proc, results


def ablate_in_process(out: Path, command: list[str], **options) -> dict:
    """ablate()'s ablation through the API the command line calls (ablation.ablate_command), in this process: its
    settings as ablate() gives them (bf16 amp, no settling pass), its results.json read back."""
    from trainfast.ablation import ablate_command

    ablate_command(command, device="cpu", out=out, show=False, amp_dtype="bf16", settle_within_s=0, **options)
    return json.loads((out / "results.json").read_text())


def run_logs(out: Path) -> str:
    """Why each run ended, as the report's log tail reads it (procs.read_log_tail: under torchrun the ranks'
    last words and the root-cause rank, not the launcher's traceback); the report's table cuts it short."""
    return "".join(f"\n== {log}\n{read_log_tail(log, lines=40)}" for log in sorted(out.glob("rungs/*/log.txt")))


def rungs(results: dict) -> dict[str, dict]:
    return {r["name"]: r for r in results["rungs"]}


class HandTimer:
    """The probe's step clock, fed by hand."""

    def __init__(self) -> None:
        self.steps, self.updates = [], 0

    def read(self) -> None:
        pass


def hand_step(probe, seconds: float, foreign: float = 0.0) -> None:
    """One optimizer update of `seconds` (16 samples) fed to the probe's hand clock, while other processes used
    `foreign` of the machine's cores, and the probe told of it as a Session's update tells it."""
    from trainfast.measure import StepTime

    other = foreign * seconds * (os.cpu_count() or 1)
    probe.timer.steps.append(StepTime(seconds, 16, 0.0, own_cpu_s=seconds, machine_cpu_s=seconds + other))
    probe.timer.updates += 1
    probe.after_update()


def test_a_full_run_of_a_script_is_timed_over_the_window_speed_mode_would_have_timed():
    # 400 steps of 10 ms, 16 samples each, and a last one of 20 s (a compiled model recompiling for a smaller last
    # batch). Over every step the rate is under half the steady one; over the window speed mode would have timed
    # (warm-up excluded, the budget met), it is the steady rate, whatever comes after.
    from trainfast.probe import MeasureSpec, Probe

    def timed(window: bool):
        probe = Probe(MeasureSpec("", "full", steps=16, seconds=60.0, floor=8, min_seconds=0.5, steady_window=window))
        probe.timer = HandTimer()
        for i in range(400):
            hand_step(probe, 20.0 if i == 399 else 0.01)
        return probe, probe.timing()

    whole_probe, whole = timed(False)
    probe, steady = timed(True)
    assert whole_probe.steady_steps is None and whole.throughput < 800
    assert 50 <= probe.steady_steps < 80 and steady.throughput == pytest.approx(1600, rel=0.01)
    assert len(steady.step_seconds) + steady.warmup_steps == probe.steady_steps


def test_speed_mode_times_millisecond_steps_for_the_seconds_the_budget_asks(tmp_path):
    # Eight steps of 60 ms (a run's first steps, slower than the rest but not told apart from them) and then 3 ms
    # steps: at the first count the slow steps make the steps needed look few, and a cap of MAX_BUDGETS times those
    # cut such a run at 120 steps, 0.4 s of them. It is timed for the budget's 2 s instead, and stops there; a run
    # whose blocks are disturbed from its first second on still stops, at the cap, no sooner than MAX_BUDGETS
    # times the 2 s.
    from trainfast.probe import MAX_BUDGETS, MeasureSpec, Probe
    from trainfast.probe.agent import step_seconds
    from trainfast.probe.contract import StopRun

    def stopped(disturbed_after: float) -> tuple[Probe, dict]:
        result = tmp_path / f"result-{disturbed_after}.json"
        probe = Probe(MeasureSpec(str(result), "speed", steps=16, seconds=60.0, floor=8, min_seconds=2.0))
        probe.timer, probe.check_disturbance, clock = HandTimer(), True, 0.0
        with pytest.raises(StopRun):
            for i in range(100_000):
                seconds = 0.06 if i < 8 else 0.003
                clock += seconds                     # other processes, from then on: 90% of the cores
                hand_step(probe, seconds, foreign=0.9 if clock > disturbed_after else 0.0)
        return probe, json.loads(result.read_text())

    probe, record = stopped(disturbed_after=float("inf"))
    assert record["stopped"] == "speed budget timed", record["stopped"]
    assert record["timing"]["timed_seconds"] >= 2.0 and step_seconds(probe.timer) < 2.0 + 0.5 + 0.1
    probe, record = stopped(disturbed_after=1.0)
    assert record["stopped"] == "step cap reached before the budget was timed", record["stopped"]
    assert MAX_BUDGETS * 2.0 <= step_seconds(probe.timer) < MAX_BUDGETS * 2.0 + 1.0


def test_ranks_agree_on_speed_modes_cap_each_reading_its_own_clock():
    # Rank 1 of two, its blocks disturbed after its first 0.3 s (the budget never met): its own clock is far from
    # the cap's 8 s when the other rank, whose steps are slower, is past it. The ranks agree on the cap (a collective
    # after the one on the steps needed), so this rank stops with the other at the same update, not 8 s later: a
    # rank that stopped alone would leave the other waiting in its next collective.
    from types import SimpleNamespace

    from trainfast.probe import MeasureSpec, Probe
    from trainfast.probe.agent import step_seconds
    from trainfast.probe.contract import StopRun

    said: list[int] = []

    def gather(value: int) -> list[int]:                      # what each rank says, this one's first
        said.append(value)
        past_cap = len(said) >= 40 and len(said) % 2 == 0      # every second call asks whether the cap is passed
        return [value, 1 if past_cap else value]

    probe = Probe(MeasureSpec("", "speed", steps=16, seconds=60.0, floor=8, min_seconds=2.0))
    probe.session = SimpleNamespace(dist=SimpleNamespace(gather=gather), world_size=2, is_main=False)
    probe.timer, probe.check_disturbance = HandTimer(), True
    with pytest.raises(StopRun):
        for i in range(100_000):
            hand_step(probe, 0.003, foreign=0.9 if i >= 100 else 0.0)                 # disturbed from 0.3 s on
    assert probe.timer.updates == 20 * 8 and step_seconds(probe.timer) < 1.0     # the 20th check: 160 updates
    assert said[-2:] == [0, 0] and probe.stopped_ranks           # it asked (its own clock: not past), then left


CUSTOM = str(ROOT / "tests" / "scripts" / "custom_optimizer_loop.py")


@pytest.fixture(scope="module")
def session_ladder(tmp_path_factory) -> tuple[Path, subprocess.CompletedProcess, dict]:
    """One speed-mode ablation of a Session script (tests/scripts/custom_optimizer_loop.py, 4,000 epochs of a
    hand-written SGD) for two tests: its baseline and amp rung stopped once timed, its fused rung failing (the
    optimizer takes no `fused`). Two rungs, not the whole default ladder: what is proven is speed mode's stop, the
    recipe reaching a Session script through the environment (the same for every rung: a rung's run starts the same
    way whatever its switches) and a failing rung reported. The whole default ladder reaches a script in
    test_the_default_ladder_reaches_a_plain_loop_..., amp and compile run to the end of a Session script in
    test_full_mode_runs_the_adopted_example_..., and each switch acts through a Session in its own fast test."""
    out = tmp_path_factory.mktemp("session") / "speed"
    proc, results = ablate(out, "--repeats", "1", "--timing-steps", "16", "--rungs", "amp,fused",
                           command=[sys.executable, CUSTOM], check=False)
    return out, proc, results


@pytest.mark.slow
@pytest.mark.alone
def test_speed_mode_stops_each_rung_of_a_session_script_once_timed(session_ladder):
    out, proc, results = session_ladder
    by_name = rungs(results)
    measured = [r for r in results["rungs"] if r["status"] == "done"]
    assert [r["name"] for r in measured] == ["baseline", "amp"], results["rungs"]
    for rung in measured:
        run = rung["runs"][0]
        assert run["session"] and run["mode"] == "speed" and run["rate_unit"] == "samples/s"
        # stopped early (its 4,000 epochs would take minutes): once timed, or at the step cap on a busy machine
        assert run["stopped"] in ("speed budget timed", "step cap reached before the budget was timed")
        assert run["steps_run"] < 4000 * 8 and run["timing"]["timed_steps"] > 0
        if run["stopped"] == "speed budget timed":
            assert run["timing"]["timed_seconds"] >= 2.0 and run["timing"]["timed_steps"] >= 16
        assert rung["throughput"] > 0
    # the rung's recipe reached the script through the environment, and the run recorded what it overrode
    assert by_name["amp"]["runs"][0]["overridden"]["precision"] == ["fp32", "bf16"]
    assert "precision" not in by_name["baseline"]["runs"][0]["overridden"]
    # each run keeps its folder: the command, the recipe, the log, the result
    run_dir = out / "rungs" / "amp-r0"
    command = json.loads((run_dir / "command.json").read_text())
    assert command["argv"][-1:] == [CUSTOM]
    assert json.loads(command["env"]["TRAINFAST_RECIPE"])["precision"] == "bf16"
    assert (run_dir / "log.txt").exists() and json.loads((run_dir / "result.json").read_text())["session"]
    assert "TRAINFAST_RECIPE overrides the script's recipe" in (run_dir / "log.txt").read_text()
    report = (out / "report.md").read_text()
    assert "samples/s" in report and "run s" in report


@pytest.mark.slow
@pytest.mark.alone
def test_a_failing_rung_is_reported_and_the_others_finish(session_ladder):
    out, proc, results = session_ladder
    assert proc.returncode == 1                               # a failed rung: the exit status says so
    by_name = rungs(results)
    assert by_name["baseline"]["status"] == "done" and by_name["amp"]["status"] == "done"
    fused = by_name["fused"]
    assert fused["status"] == "failed" and "exited with status 1" in fused["error"]
    assert "HandSGD takes no foreach/fused argument" in fused["log_tail"]
    assert "HandSGD takes no foreach/fused argument" in (out / "report.md").read_text()


@pytest.mark.slow
def test_full_mode_compares_the_reported_metric_with_the_baselines_band(tmp_path):
    out = tmp_path / "full"
    script = str(ROOT / "tests" / "scripts" / "report_loop.py")
    # the baseline's two timed runs are its two seeds: four runs (a baseline seed run beyond its repeats, full mode:
    # test_printed_metric's plain loop and test_target's Session script)
    proc, results = ablate(out, "--measure", "full", "--rungs", "amp", "--repeats", "2", "--noise-seeds", "2",
                           "--settle-within", "0", "--metric", "val_loss", command=[sys.executable, script])
    by_name = rungs(results)
    base, amp = by_name["baseline"], by_name["amp"]
    assert results["settings"]["measure"] == "full" and results["settings"]["metric"]["name"] == "val_loss"
    for rung in (base, amp):
        assert rung["status"] == "done"
        assert all(run["stopped"] == "script ended" and "val_accuracy" in run["reported"] for run in rung["runs"])
        # the metric compared is the one named, the mean over the rung's runs
        assert rung["metric"]["value"] == pytest.approx(sum(r["reported"]["val_loss"] for r in rung["runs"]) / 2)
    assert len(results["baseline_seeds"]) == 2                # the baseline's seeds make the band
    seeds = [s["metric"] for s in results["baseline_seeds"]]
    assert len(set(seeds)) == 2                               # the ablation's seed reached the script
    assert amp["metric_band"] > 0 and "metric_delta" in amp and isinstance(amp["metric_flag"], bool)
    # a loss is minimized: worse means higher
    assert amp["metric_worse"] == (amp["metric_flag"] and amp["metric_delta"] > 0)
    report = (out / "report.md").read_text()
    assert "val_loss (Δ)" in report and "val_loss noise band" in report


@pytest.mark.slow
def test_full_mode_runs_the_adopted_example_to_its_end_in_each_rung(tmp_path):
    """amp and compile: the two rungs whose full runs differ most from a speed run (autocast through the whole
    evaluation, compilation inside the script's own epoch); the whole default ladder runs in
    test_the_default_ladder_reaches_a_plain_loop_... Asked for val_f1, which the example never reports (it reports
    val_accuracy): the recommendation says it was made on speed alone, in the terminal and in report.md, instead of
    a table of dashes and nothing else. (One ablation for both: the metric a run reported is read from its record
    whatever metric was asked for.)"""
    out = tmp_path / "full-ladder"
    proc, results = ablate(out, "--measure", "full", "--metric", "val_f1", "--repeats", "1", "--noise-seeds", "1",
                           "--rungs", "amp,compile", command=[sys.executable, ADOPTED, "--epochs", "1"])
    measured = [r for r in results["rungs"] if r["status"] == "done"]
    assert [r["name"] for r in measured] == ["baseline", "amp", "compile"]
    for rung in measured:
        run = rung["runs"][0]
        assert run["stopped"] == "script ended" and 0.2 < run["reported"]["val_accuracy"] <= 1.0
        assert (rung["metric"] or {}).get("value") is None          # val_f1: never reported
    said = "on speed alone: the script never reported val_f1, so no rung's accuracy was checked"
    assert said in " ".join(proc.stdout.split()) and said in " ".join((out / "report.md").read_text().split())


@pytest.mark.slow
def test_the_default_ladder_reaches_a_plain_loop_and_reads_each_switch_back(tmp_path):
    """A plain loop (no Session, no framework, not edited): the default ladder's switches are applied in its process
    through the probe's hooks, each read back applied and observed; what cannot reach it is said so; the
    process-wide rungs join the ladder. In this process, through the API the command line calls (the command line's
    own path is every other test's here): a plain loop's millisecond steps timed over 8 steps, not stretched to
    the 2 s the command line's timing budget gives them (what is read is each switch, not its speed)."""
    from trainfast.ablation import TimingBudget, ablate_command

    out = tmp_path / "plain"
    ablate_command([sys.executable, str(ROOT / "tests" / "scripts" / "plain_loop.py"), "--steps", "40", "--epochs",
                    "50"], device="cpu", out=out, repeats=1, noise_seeds=1, show=False, settle_within_s=0,
                   amp_dtype="bf16", budget=TimingBudget(steps=8, min_seconds=0.0))
    results = json.loads((out / "results.json").read_text())
    by_name = rungs(results)
    base = by_name["baseline"]["runs"][0]
    assert base["session"] is False and base["rate_unit"] == "steps/s"
    assert base["observed"]["precision"] == "fp32" and base["observed"]["by"] == {}
    seen = {"amp": ("precision", "bf16"), "channels_last": ("memory_format", "channels_last"),
            "compile": ("compiled", True), "fused": ("optimizer_implementation", "fused")}
    for name, (key, value) in seen.items():
        rung = by_name[name]
        assert rung["status"] == "done" and rung["throughput"] > 0, rung
        run = rung["runs"][0]
        assert all(s["applied"] for s in run["frameworks"]["plain loop"]["switches"].values()), run["frameworks"]
        assert run["observed"][key] == value and "trainfast" in run["observed"]["by"].values()
    assert by_name["set_to_none"]["status"] == "no-effect" and by_name["set_to_none"]["throughput"] is None
    assert "a plain loop" in by_name["set_to_none"]["effect_reason"]
    passive = by_name["passive_threads"]
    assert passive["status"] == "done" and passive["runs"][0]["process_switches"]["passive_threads"] is True
    assert "added to the default ladder" in passive["effect_reason"]
    started = json.loads((out / "rungs" / "passive_threads-r0" / "command.json").read_text())["env"]
    assert started["OMP_WAIT_POLICY"] == "PASSIVE"
    report = (out / "report.md").read_text()
    assert "**plain loop**" in report and "**observed**" in report and "```json" not in report


def test_commands_that_cannot_run_are_refused_before_any_run(tmp_path, capsys):
    """In this process (each refusal comes before any work): the exit status, the message, no folder."""
    from trainfast.cli import main

    cases = [([], [], "no command after `--`"),
             ([], ["no-such-program-xyz"], "'no-such-program-xyz' is not an executable on PATH"),
             ([], [sys.executable, str(tmp_path / "missing.py")], "missing.py' does not exist"),
             (["--nproc", "2"], ["true"], "give the command as `python your_script.py ...`")]
    for flags, command, message in cases:
        out = tmp_path / "refused"
        assert main(["ablate", "--out", str(out), *flags, "--", *command]) == 2
        assert message in capsys.readouterr().err
        assert not out.exists()


@pytest.mark.slow
def test_a_command_that_fails_or_never_steps_is_reported_with_its_log(tmp_path):
    """One ablation for both ends (an ablation's own start and close cost more than these runs): the baseline's
    command exits with status 3 after printing, the set_to_none rung's (its recipe reaches the script through the
    environment) exits 0 without a single optimizer step. In this process, through the API the command line calls
    (a failed run's exit status: test_a_failing_rung_is_reported_and_the_others_finish)."""
    out = tmp_path / "bad"
    script = tmp_path / "nostep.py"
    script.write_text("import json, os, sys\nprint('loading data...')\n"
                      "recipe = json.loads(os.environ.get('TRAINFAST_RECIPE', '{}'))\n"
                      "sys.exit(0 if recipe.get('set_to_none') else 3)\n")
    results = ablate_in_process(out, [sys.executable, str(script)], rungs=["set_to_none"], repeats=1)
    failed, never_stepped = rungs(results)["baseline"], rungs(results)["set_to_none"]
    assert failed["status"] == "failed" and "exited with status 3" in failed["error"], failed
    assert "loading data..." in failed["log_tail"]
    assert never_stepped["status"] == "failed" and "without a single optimizer step" in never_stepped["error"]
    assert "loading data..." in never_stepped["log_tail"]
