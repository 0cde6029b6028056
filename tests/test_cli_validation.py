"""Numeric flags outside the Recipe are refused at parse time, naming the flag and the value, before any
data is loaded or any model is built."""
from __future__ import annotations

import importlib

import pytest

from trainfast.cli import build_parser, main


@pytest.fixture
def no_work(monkeypatch):
    """Any data loading, training, ablation or benchmark would fail the test: a refused flag must stop
    the command before it reaches them."""
    def forbidden(*args, **kwargs):
        raise AssertionError("work started although a flag was invalid")

    # Modules by name; the CLI takes `ablate` from the trainfast.ablation package when it runs.
    for module, name in (("trainfast.data.loading", "load_data"), ("trainfast.trainer", "train"),
                         ("trainfast.ablation", "ablate"), ("trainfast.bench_data", "bench_data")):
        monkeypatch.setattr(importlib.import_module(module), name, forbidden)


def refused(argv: list[str], capsys) -> str:
    with pytest.raises(SystemExit) as info:
        main(argv)
    assert info.value.code == 2
    return capsys.readouterr().err


@pytest.mark.parametrize("command", ["train", "ablate"])
@pytest.mark.parametrize("value", ["0", "-5"])
def test_image_size_zero_or_negative_is_refused_naming_the_flag(command, value, capsys, no_work):
    err = refused([command, "--image-size", value], capsys)
    assert f"argument --image-size: must be a positive integer, got {value}" in err


@pytest.mark.parametrize("argv, flag, value", [
    (["ablate", "--noise-seeds", "0"], "--noise-seeds", "0"),
    (["ablate", "--nproc", "0"], "--nproc", "0"),
    (["ablate", "--nproc", "-2"], "--nproc", "-2"),
    (["bench-data", "--data", "imagefolder:x", "--batch-size", "0"], "--batch-size", "0"),
    (["bench-data", "--data", "imagefolder:x", "--passes", "0"], "--passes", "0"),
    (["bench-data", "--data", "imagefolder:x", "--image-size", "-1"], "--image-size", "-1"),
])
def test_other_counts_below_one_are_refused_naming_the_flag(argv, flag, value, capsys, no_work):
    assert f"argument {flag}: must be a positive integer, got {value}" in refused(argv, capsys)


def test_bench_data_workers_may_be_zero_or_auto_but_not_negative(capsys, no_work):
    err = refused(["bench-data", "--data", "imagefolder:x", "--num-workers", "-1"], capsys)
    assert "argument --num-workers: must be 0 or more (or auto), got -1" in err
    parser = build_parser()
    for value, parsed in (("0", 0), ("3", 3), ("auto", "auto")):
        args = parser.parse_args(["bench-data", "--data", "imagefolder:x", "--num-workers", value])
        assert args.num_workers == parsed


def test_a_value_that_is_not_a_number_is_refused_as_before(capsys, no_work):
    assert "argument --image-size: invalid int value: 'big'" in refused(["train", "--image-size", "big"], capsys)


def test_valid_values_parse_unchanged():
    parser = build_parser()
    assert parser.parse_args(["train", "--image-size", "16"]).image_size == 16
    assert parser.parse_args(["train"]).image_size is None              # not given: the dataset's default
    args = parser.parse_args(["ablate", "--noise-seeds", "1", "--nproc", "2"])
    assert (args.noise_seeds, args.nproc) == (1, 2)
    args = parser.parse_args(["bench-data", "--data", "imagefolder:x", "--batch-size", "8", "--passes", "1"])
    assert (args.batch_size, args.passes, args.image_size) == (8, 1, 224)


def test_an_unknown_flag_gets_the_subcommands_usage_not_the_top_levels(capsys):
    from trainfast.cli import main

    with pytest.raises(SystemExit) as raised:
        main(["train", "--frobnicate"])
    err = capsys.readouterr().err
    assert raised.value.code == 2 and err.startswith("usage: trainfast train ")
    assert "trainfast train: error: unrecognized arguments: --frobnicate" in err
