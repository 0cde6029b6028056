"""A plain script's metric read from what it prints (printedmetric.py, probe/printed.py): `--metric NAME` on a line
such as pytorch/examples' ImageNet script's ` * Acc@1 12.500 Acc@5 50.000`, `--metric-pattern` for other shapes, the
last match the run's value, in the record's `reported` where every script's metric is read; refused before any work
when the pattern cannot be used. The loop (tests/scripts/plain_loop.py --val) runs in this process."""
from __future__ import annotations

import contextlib
import io
import sys
from pathlib import Path
from types import SimpleNamespace

import pytest
from test_observed import plain_loop

from trainfast.ablation.metric import choose_metric
from trainfast.printedmetric import PrintedMetric, default_pattern, read_value
from trainfast.probe.printed import SECTION, LineReader, PrintedSection
from trainfast.probe.record import script_said
from trainfast.target import parse_target


@pytest.mark.parametrize("name, line, value", [
    ("Acc@1", " * Acc@1 12.500 Acc@5 50.000", 12.5),
    ("Acc@5", " * Acc@1 12.500 Acc@5 50.000", 50.0),
    ("Acc@1", "Epoch: [0][ 0/10]\tTime  0.1 ( 0.1)\tAcc@1   3.00 (  3.00)", 3.0),
    ("loss", "epoch 3 val_loss: 0.5 loss=0.25", 0.25),             # not the tail of val_loss
    ("val_loss", "epoch 3 val_loss: 0.5 loss=0.25", 0.5),
    ("acc", "acc 9.5e-1", 0.95),
    ("Acc@1", "Acc@10 5.0", None),                                 # not the head of a longer name
    ("acc", "accuracy 0.5", None),
    ("loss", "loss: nan", None),
])
def test_the_default_pattern_reads_name_then_a_number(name, line, value):
    assert read_value(PrintedMetric(name).regex(), line) == value


def fake_probe(session=None) -> SimpleNamespace:
    said = []
    return SimpleNamespace(session=session, sections={}, reported=said.append, said=said)


def printed(probe, wanted: PrintedMetric, argv: list[str]) -> tuple[PrintedSection, str]:
    """The plain loop run with its output read as a measured run reads it; what reached its own stream."""
    section = PrintedSection(probe, wanted)
    probe.sections[SECTION] = section
    passed = io.StringIO()
    with contextlib.redirect_stdout(LineReader(passed, section)):
        plain_loop().main(["--steps", "3", "--val", *argv])
    return section, passed.getvalue()


def test_a_plain_loops_printed_accuracy_is_its_reported_metric_the_last_line_its_value():
    probe = fake_probe()
    section, out = printed(probe, PrintedMetric("Acc@1"), ["--epochs", "2"])
    lines = out.splitlines()
    validations = [read_value(section.regex, line) for line in lines if line.startswith(" * ")]
    assert len(lines) == 8 and len(validations) == 2             # the script's output, passed through whole
    assert section.metrics == {"Acc@1": validations[-1]} and section.matches == 8
    assert probe.said[-1] == {"Acc@1": validations[-1]} and len(probe.said) == 8     # each line a report
    record = script_said(probe).to_dict()
    assert record["reported"] == {"Acc@1": validations[-1]}
    assert record[SECTION]["value"] == validations[-1] and record[SECTION]["last_line"].startswith("* Acc@1")
    choice = choose_metric("Acc@1", None, record)
    assert (choice.name, choice.goal) == ("Acc@1", "max")
    assert parse_target("Acc@1>=50").name == "Acc@1"              # --target can name it


def test_a_pattern_picks_the_validation_line_and_a_session_keeps_its_own_reports():
    probe = fake_probe()
    section, _ = printed(probe, PrintedMetric("top1", r"^ \* Acc@1 (?P<value>[0-9.]+)"), [])
    assert section.matches == 1 and len(probe.said) == 1
    # A Session reports its values itself: the default pattern leaves its printed copies alone, a given one reads
    session = fake_probe(session=object())
    section, _ = printed(session, PrintedMetric("Acc@1"), [])
    assert section.matches == 0 and section.skipped == 4 and session.said == []
    section, _ = printed(session, PrintedMetric("Acc@1", r"Acc@1 +([0-9.]+)"), [])
    assert section.matches == 4


def test_the_run_reads_the_metric_it_was_asked_for_from_its_spec(tmp_path):
    from trainfast.ablation.work import CommandWork, printed_metric

    work = CommandWork(None, None, None, [], None, {"metric_pattern": r"Acc@1 (\S+)"}, metric_name="Acc@1")
    assert PrintedMetric.from_dict(printed_metric(work)) == PrintedMetric("Acc@1", r"Acc@1 (\S+)")
    assert printed_metric(CommandWork(None, None, None, [], None, {})) is None
    assert default_pattern("a.b").startswith("(?<!")


@pytest.mark.parametrize("flags, message", [
    (["--metric", "acc", "--metric-pattern", "acc ([0-9]"], "is not a regular expression"),
    (["--metric", "acc", "--metric-pattern", "acc [0-9]+"], "has no group around the number"),
    (["--metric-pattern", "acc ([0-9]+)"], "needs --metric NAME"),
])
def test_a_pattern_that_cannot_read_a_number_is_refused_before_any_work(tmp_path, capsys, flags, message):
    from trainfast.cli import main

    out = tmp_path / "refused"
    script = str(Path(__file__).parent / "scripts" / "plain_loop.py")
    assert main(["ablate", "--out", str(out), *flags, "--measure", "full", "--", sys.executable, script]) == 2
    assert message in capsys.readouterr().err and not out.exists()


@pytest.mark.slow
def test_a_plain_loop_is_judged_on_its_printed_accuracy_with_fp16_and_its_scaler_put_in(tmp_path):
    """One small full-mode ablation (the baseline's two seeds and one fp16 run) of the plain loop as it is: every run
    judged on the Acc@1 its last validation line printed, and the fp16 rung's autocast and loss scaler read back."""
    from test_ablate_command import ablate, rungs

    script = str(Path(__file__).parent / "scripts" / "plain_loop.py")
    out = tmp_path / "printed"
    _, results = ablate(out, "--switches", "amp", "--amp-dtype", "fp16", "--repeats", "1", "--noise-seeds", "2",
                        "--timing-steps", "8", "--measure", "full", "--metric", "Acc@1",
                        command=[sys.executable, script, "--steps", "40", "--val"])
    assert (results["metric"]["name"], results["metric"]["goal"]) == ("Acc@1", "max")
    by_name = rungs(results)
    for name in ("baseline", "amp"):
        rung = by_name[name]
        assert rung["status"] == "done" and rung["metric"]["value"] is not None, rung
        log = (out / "rungs" / f"{name}-r0" / "log.txt").read_text()
        printed = [line for line in log.splitlines() if line.startswith(" * Acc@1")][-1]
        assert rung["runs"][0]["reported"] == {"Acc@1": float(printed.split()[2])}
    assert by_name["baseline"]["seed_runs"][0]["reported"]["Acc@1"] >= 0         # the second seed judged too
    run = by_name["amp"]["runs"][0]
    switched = run["frameworks"]["plain loop"]["switches"]
    assert switched["autocast"]["applied"] and run["observed"]["precision"] == "fp16"
    assert switched["torch.amp.GradScaler"]["applied"] and switched["torch.amp.GradScaler"]["read_back"].startswith(
        "40 steps scaled")
    assert run["scaler_skips"] is not None and run["precision_state"]["loss_scale"] > 0
    assert "Acc@1 (Δ)" in (out / "report.md").read_text()
