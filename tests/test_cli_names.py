"""One name per concept across the subcommands (docs/cli.md): the canonical flags, their aliases (old
spellings that keep working), one duration syntax parsed by one function for every time flag, and one
shape of --resume. Parsing only: nothing here loads data or trains."""
from __future__ import annotations

import argparse
import importlib
import re

import pytest

from trainfast.cli import SUBCOMMANDS, build_parser, main, parse_command_line, recipe_from_args
from trainfast.cliargs import Duration, format_duration, parse_duration, resume_checkpoint, resume_folder


def subparser(name: str) -> argparse.ArgumentParser:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    parser = sub.choices[name]
    parser.ensure_flags()
    return parser


class Captured(Exception):
    """Raised by a stand-in for the work a command would start: carries what the CLI passed it."""

    def __init__(self, *args, **kwargs):
        super().__init__("captured")
        self.args_, self.kwargs = args, kwargs


def capture(monkeypatch, module: str, name: str) -> None:
    def stand_in(*args, **kwargs):
        raise Captured(*args, **kwargs)
    monkeypatch.setattr(importlib.import_module(module), name, stand_in)


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


# --- aliases -----------------------------------------------------------------------------------------------

ALIASES = [   # (subcommand, canonical argv, alias argv, dest, value both give)
    ("ablate", ["--switches", "amp,fused"], ["--rungs", "amp,fused"], "switches", "amp,fused"),
    ("tune", ["--switches", "fused"], ["--rungs", "fused"], "switches", "fused"),
    ("ablate", ["--timing-budget", "90s"], ["--timing-seconds", "90"], "timing_budget", 90.0),
    ("tune", ["--timing-budget", "2m"], ["--timing-seconds", "120"], "timing_budget", 120.0),
    ("doctor", ["--script-timeout", "30s"], ["--timeout", "30"], "script_timeout", 30.0),
    ("doctor", ["--timing-steps", "3"], ["--steps", "3"], "timing_steps", 3),
    *[(c, ["--dist-timeout", "2m"], ["--dist-timeout-s", "120"], "dist_timeout_s", 120)
      for c in ("train", "ablate", "tune", "doctor")],
]


@pytest.mark.parametrize("command, canonical, alias, dest, value", ALIASES)
def test_an_alias_parses_to_the_same_value_as_the_canonical_name(command, canonical, alias, dest, value):
    parser = build_parser()
    assert getattr(parser.parse_args([command, *canonical]), dest) == value
    assert getattr(parser.parse_args([command, *alias]), dest) == value
    assert getattr(parser.parse_args([command]), dest) != value          # the value came from the flag


def test_the_recipe_gets_whole_seconds_from_dist_timeout():
    parser = build_parser()
    assert recipe_from_args(parser.parse_args(["train", "--dist-timeout", "1.5h"])).dist_timeout_s == 5400
    assert recipe_from_args(parser.parse_args(["train", "--dist-timeout-s", "90"])).dist_timeout_s == 90
    assert recipe_from_args(parser.parse_args(["train", "--dist-timeout", "2.5"])).dist_timeout_s == 3  # rounded up
    assert recipe_from_args(parser.parse_args(["train"])).dist_timeout_s == 300


# --- durations ---------------------------------------------------------------------------------------------

@pytest.mark.parametrize("text, seconds", [
    ("90", 90.0), ("90s", 90.0), ("10m", 600.0), ("1.5h", 5400.0), ("0.5", 0.5), ("0", 0.0), (" 2M ", 120.0),
    ("1e2s", 100.0),
])
def test_the_duration_parser_accepts(text, seconds):
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "10x", "m", "-5", "-1m", "inf", "nan", "1e400", "10 minutes"])
def test_the_duration_parser_refuses(text):
    with pytest.raises(ValueError):
        parse_duration(text)


@pytest.mark.parametrize("seconds, text", [(900, "15m"), (7200, "2h"), (150, "150s"), (60, "1m"), (2.5, "2.5s")])
def test_a_default_is_shown_as_a_duration_the_parser_reads_back(seconds, text):
    assert format_duration(seconds) == text and parse_duration(text) == seconds


@pytest.mark.parametrize("argv, flag, value", [
    (["tune", "--budget", "soon"], "--budget", "'soon'"),
    (["tune", "--budget", "0"], "--budget", "'0'"),
    (["ablate", "--rung-timeout", "5 min"], "--rung-timeout", "'5 min'"),
    (["ablate", "--settle-within", "-1"], "--settle-within", "'-1'"),
    (["ablate", "--timing-seconds", "1x"], "--timing-budget", "'1x'"),      # named by its canonical name too
    (["doctor", "--eval-within", "later"], "--eval-within", "'later'"),
    (["doctor", "--timeout", "0"], "--script-timeout", "'0'"),
    (["train", "--dist-timeout", "forever"], "--dist-timeout", "'forever'"),
])
def test_a_bad_duration_is_refused_naming_the_flag_and_the_value(argv, flag, value, capsys):
    err = refused(argv, capsys)
    assert re.search(rf"argument {flag}\b.*: must be a duration like 90, 90s, 10m or 1.5h .*got {value}", err), err


def test_a_window_may_be_zero_but_a_limit_may_not():
    parser = build_parser()
    assert parser.parse_args(["ablate", "--settle-within", "0"]).settle_within == 0.0
    assert parser.parse_args(["doctor", "--eval-within", "0s"]).eval_within == 0.0
    with pytest.raises(SystemExit):
        parser.parse_args(["ablate", "--rung-timeout", "0"])


DURATION_DEST = re.compile(r"(timeout|within|budget|seconds)(_s)?$")
DURATION_NAME = re.compile(r"^--([a-z]+-)?(timeout|within|budget)$")    # no unit in the name: it is in the value


def duration_flags_not_following_the_rule(parser: argparse.ArgumentParser) -> list[str]:
    """Every flag whose dest says it is a time must be parsed by the one Duration type, shown as DURATION,
    and named by the rule; returns the ones that are not."""
    wrong = []
    for action in parser._actions:
        if action.option_strings and DURATION_DEST.search(action.dest):
            if not (isinstance(action.type, Duration) and action.metavar == "DURATION"
                    and DURATION_NAME.match(action.option_strings[0])):
                wrong.append(action.option_strings[0])
    return wrong


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_every_duration_flag_uses_the_one_duration_type(command):
    assert duration_flags_not_following_the_rule(subparser(command)) == []


def test_the_duration_flags_are_found_and_the_check_can_fail():
    found = {a.dest for c in SUBCOMMANDS for a in subparser(c)._actions if isinstance(a.type, Duration)}
    assert found == {"dist_timeout_s", "rung_timeout", "settle_within", "timing_budget", "budget",
                     "script_timeout", "eval_within", "rdzv_timeout"}
    bad = argparse.ArgumentParser()
    bad.add_argument("--warmup-timeout", type=float, metavar="SECONDS")        # a plain float
    bad.add_argument("--idle-seconds", type=Duration(), metavar="DURATION")    # the unit in the name
    bad.add_argument("--stall-timeout", type=Duration(), metavar="DURATION")   # fine
    assert duration_flags_not_following_the_rule(bad) == ["--warmup-timeout", "--idle-seconds"]


# --- help --------------------------------------------------------------------------------------------------

CANONICAL = {
    "ablate": ["--switches", "--timing-steps", "--timing-budget", "--rung-timeout", "--settle-within", "--resume",
               "--out", "--nproc", "--amp-dtype", "--min-effect", "--repeats", "--metric", "--dist-timeout"],
    "tune": ["--switches", "--timing-steps", "--timing-budget", "--budget", "--resume", "--out", "--nproc",
             "--amp-dtype", "--min-effect", "--repeats", "--metric", "--dist-timeout"],
    "doctor": ["--timing-steps", "--script-timeout", "--eval-within", "--out", "--dist-timeout", "--nproc"],
    "train": ["--resume", "--out", "--dist-timeout"],
    "bench-data": ["--data", "--batch-size", "--num-workers", "--image-size", "--device"],
}
ALIAS_OF = {"--rungs": "--switches", "--timing-seconds": "--timing-budget", "--timeout": "--script-timeout",
            "--steps": "--timing-steps", "--dist-timeout-s": "--dist-timeout"}


@pytest.mark.parametrize("command", list(SUBCOMMANDS))
def test_the_help_shows_every_canonical_name_and_names_aliases_only_as_aliases(command):
    text = subparser(command).format_help()
    flat = " ".join(text.split())
    listed = set(re.findall(r"^  (--[a-z-]+)", text, flags=re.MULTILINE))    # the option lines
    for flag in CANONICAL.get(command, []):      # a subcommand added later: its aliases are still checked
        assert flag in listed, flag
    outside_notes = re.sub(r"\(alias: [^)]*\)", "", flat)
    for alias, canonical in ALIAS_OF.items():
        # named only in its canonical flag's "(alias: ...)", never offered as a flag of its own
        assert not re.search(rf"(?<![\w-]){alias}(?![\w-])", outside_notes), alias
        if canonical in listed and alias in flat:
            assert f"(alias: {alias})" in flat


def test_the_same_flag_has_the_same_help_in_ablate_and_tune():
    helps = {c: {a.option_strings[0]: a.help for a in subparser(c)._actions if a.option_strings}
             for c in ("ablate", "tune")}
    for flag in ("--amp-dtype", "--min-effect", "--timing-steps", "--timing-budget", "--metric-goal"):
        assert helps["ablate"][flag] == helps["tune"][flag], flag
    for flag in ("--out", "--resume", "--switches", "--repeats"):      # the same words, the subcommand's object
        assert helps["ablate"][flag].split()[0] == helps["tune"][flag].split()[0], flag


# --- --resume [WHAT] ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("argv, resume, out, command", [
    (["ablate", "--resume", "--out", "D", "--", "python", "x.py"], "auto", "D", ["python", "x.py"]),
    (["ablate", "--out", "D", "--resume", "--", "python", "x.py"], "auto", "D", ["python", "x.py"]),
    (["ablate", "--resume", "--", "python", "x.py"], "auto", None, ["python", "x.py"]),
    (["ablate", "--resume", "runs/a1", "--", "python", "x.py"], "runs/a1", None, ["python", "x.py"]),
    (["ablate", "--out", "D", "--resume"], "auto", "D", None),
    (["ablate", "--out", "D", "--resume", "--batch-size", "16"], "auto", "D", None),
    (["tune", "--resume", "--out", "D", "--", "python", "x.py", "--resume"], "auto", "D",
     ["python", "x.py", "--resume"]),
    (["tune", "--out", "D"], None, "D", None),
    (["train", "--resume", "auto", "--out", "D"], "auto", "D", None),
    (["train", "--out", "D", "--resume"], "auto", "D", None),
    (["train", "--resume", "D/checkpoints/last.pt", "--out", "D"], "D/checkpoints/last.pt", "D", None),
])
def test_resume_takes_an_optional_value_and_never_swallows_the_command(argv, resume, out, command):
    args = parse_command_line(argv)
    assert (args.resume, args.out, args.user_command) == (resume, out, command)


def test_resume_folder_for_ablate_and_tune(tmp_path):
    assert resume_folder(None, "D") == (False, "D")
    assert resume_folder("auto", "D") == (True, "D")
    assert resume_folder(str(tmp_path), None) == (True, str(tmp_path))
    assert resume_folder(str(tmp_path), str(tmp_path)) == (True, str(tmp_path))
    with pytest.raises(ValueError, match="--resume needs --out DIR"):
        resume_folder("auto", None)
    with pytest.raises(ValueError, match="name different folders"):
        resume_folder(str(tmp_path), str(tmp_path / "other"))


def test_resume_for_train_takes_a_run_folder_or_a_checkpoint_file(tmp_path):
    run = tmp_path / "r1"
    run.mkdir()
    assert resume_checkpoint(None, None) == (None, None)
    assert resume_checkpoint("auto", "D") == ("auto", "D")
    assert resume_checkpoint(str(run), None) == ("auto", str(run))          # the run folder: its newest checkpoint
    assert resume_checkpoint("ck.pt", "D") == ("ck.pt", "D")
    with pytest.raises(ValueError, match="--resume needs --out DIR"):
        resume_checkpoint("ck.pt", None)


# --- what the commands pass on (the python API keeps its own names) ----------------------------------------

def test_ablate_maps_the_cli_names_onto_the_python_api(monkeypatch, tmp_path):
    capture(monkeypatch, "trainfast.ablation", "ablate")
    with pytest.raises(Captured) as info:
        main(["ablate", "--rungs", "amp, fused", "--timing-seconds", "2m", "--rung-timeout", "1h",
              "--settle-within", "90s", "--resume", str(tmp_path)])
    opts = info.value.kwargs
    assert opts["rungs"] == ["amp", "fused"] and opts["budget"].seconds == 120.0
    assert (opts["rung_timeout"], opts["settle_within_s"]) == (3600.0, 90.0)
    assert (opts["resume"], opts["out"]) == (True, str(tmp_path))


def test_tune_maps_the_cli_names_onto_the_python_api(monkeypatch):
    capture(monkeypatch, "trainfast.tune", "tune")
    with pytest.raises(Captured) as info:
        main(["tune", "--budget", "10m", "--switches", "fused,compile", "--timing-budget", "30", "--out", "D",
              "--resume"])
    opts = info.value.kwargs
    assert (opts["budget_s"], opts["switches"], opts["timing"].seconds) == (600.0, ["fused", "compile"], 30.0)
    assert (opts["resume"], opts["out"]) == (True, "D")


def test_doctor_passes_its_durations_in_seconds(monkeypatch):
    capture(monkeypatch, "trainfast.doctor", "observe_script")
    with pytest.raises(Captured) as info:
        main(["doctor", "--timeout", "2m", "--eval-within", "0", "--steps", "3", "--device", "cpu", "--", "python",
              "x.py"])
    kwargs = info.value.kwargs
    assert (kwargs["timeout_s"], kwargs["eval_within"], kwargs["steps"]) == (120.0, 0.0, 3)


def test_train_resume_with_a_run_folder_continues_in_it(monkeypatch, tmp_path):
    capture(monkeypatch, "trainfast.trainer", "train")
    with pytest.raises(Captured) as info:
        main(["train", "--resume", str(tmp_path), "--device", "cpu"])
    assert (info.value.kwargs["resume"], str(info.value.kwargs["out"])) == ("auto", str(tmp_path))


@pytest.mark.parametrize("argv, message", [
    (["ablate", "--resume"], "--resume needs --out DIR"),
    (["tune", "--resume", "A", "--out", "B"], "name different folders"),
    (["tune", "--nproc", "2"], "--nproc runs a `-- COMMAND`"),
])
def test_a_resume_or_nproc_that_cannot_work_is_refused_before_any_work(argv, message, monkeypatch, capsys):
    for module, name in (("trainfast.ablation", "ablate"), ("trainfast.tune", "tune")):
        capture(monkeypatch, module, name)
    assert main(argv) == 2
    assert message in capsys.readouterr().err


# --- the spellings people already use keep working ---------------------------------------------------------

@pytest.mark.parametrize("argv", [
    ["ablate", "--rungs", "amp,channels_last", "--out", "D", "--resume"],
    ["ablate", "--timing-steps", "8", "--timing-seconds", "30", "--rung-timeout", "600", "--settle-within", "0"],
    ["ablate", "--nproc", "2", "--rungs", "amp,fused", "--measure", "full", "--metric", "acc"],
    ["tune", "--budget", "15m", "--switches", "fused", "--resume", "--out", "D"],
    ["tune", "--budget", "600", "--timing-steps", "8", "--no-settle"],
    ["doctor", "--steps", "4", "--timeout", "600", "--eval-within", "120", "--out", "D"],
    ["train", "--out", "D", "--save-every", "200", "--resume", "auto"],
    ["train", "--dist-timeout-s", "300", "--out", "D", "--resume", "D/checkpoints/last.pt"],
    ["bench-data", "--data", "imagefolder:x", "--num-workers", "auto", "--passes", "3"],
])
def test_old_invocations_still_parse(argv):
    parse_command_line(argv)
