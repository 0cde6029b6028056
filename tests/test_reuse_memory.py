"""reuse_memory: glibc's malloc keeps freed memory mapped for the next step (techniques/memory_reuse.py), set by a
Session in its process or by the environment a command starts with, read back in the rung, and not claimed where
another C library or allocator serves the process."""
from __future__ import annotations

import pytest
import torch

from trainfast import Recipe
from trainfast.launch import run_environment
from trainfast.probe import MeasureSpec
from trainfast.tasks.effects import data_effect
from trainfast.techniques import memory_reuse, process_env, threads

glibc = pytest.mark.skipif(memory_reuse.unavailable() is not None, reason=str(memory_reuse.unavailable()))

# A step of a small conv net whose activations are 40 MiB each (above the 32 MiB up to which glibc's malloc may come
# to serve a block from its heap; the second conv a cheap per-channel one, since the faults are the activations',
# not the arithmetic's), its page faults counted by the kernel after warm-up (the median step). A fresh interpreter
# for each, so the malloc settings are its own.
FAULTS = """
import json, resource, torch
from torch import nn
from trainfast import Recipe, Session
Session(Recipe(reuse_memory={on}), env=False, device="cpu")
torch.manual_seed(0)
model = nn.Sequential(nn.Conv2d(3, 64, 3, padding=1), nn.ReLU(), nn.Conv2d(64, 64, 1, groups=64), nn.ReLU())
images = torch.randn(10, 3, 128, 128)
for _ in range(2):
    model(images).mean().backward()
steps = []
for _ in range(5):
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    model(images).mean().backward()
    steps.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
faults = sorted(steps)[len(steps) // 2]     # the median step: the heap still grows once now and then
from trainfast.techniques import memory_reuse
print(json.dumps([faults, memory_reuse.in_effect()]))
"""
ACTIVATION = (10 * 64 * 128 * 128 * 4) // 4096     # the pages of one 40 MiB activation


def fresh_python(code: str, **env: str) -> list:
    """conftest.fresh_python without this process's malloc settings (glibc's defaults at its start)."""
    from conftest import fresh_python as run

    return run(code, drop=tuple(memory_reuse.ENV), **env)


@pytest.mark.slow
@glibc
def test_freed_memory_is_reused_instead_of_faulted_in_again():
    default, off = fresh_python(FAULTS.format(on=False))
    reused, on = fresh_python(FAULTS.format(on=True))
    assert (off, on) == (False, True)
    assert default > 4 * ACTIVATION                        # glibc maps and unmaps each activation: its pages fault anew
    assert reused < 0.1 * default                     # kept mapped: written again without a fault


@glibc
def test_a_command_starts_with_it_and_its_baseline_without():
    spec = MeasureSpec("/tmp/result.json", "speed")
    env = run_environment({"reuse_memory": True}, spec)
    assert env["MALLOC_MMAP_MAX_"] == "0" and int(env["MALLOC_TRIM_THRESHOLD_"]) >= 1 << 40
    assert "MALLOC_MMAP_MAX_" not in run_environment({"reuse_memory": False}, spec)
    # The environment alone sets it (a command with no Session: glibc reads it before the first allocation).
    faults, in_effect = fresh_python(FAULTS.format(on=False).replace("Session(", "(lambda *a, **k: 0)("),
                                     **memory_reuse.ENV)
    assert in_effect is True and faults < 0.5 * ACTIVATION


def test_not_applicable_where_glibc_does_not_serve_the_process(monkeypatch):
    monkeypatch.setattr(memory_reuse.platform, "libc_ver", lambda: ("", ""))
    memory_reuse.unavailable.cache_clear()
    try:
        effect = data_effect("reuse_memory", torch.device("cpu"), None)
        assert not effect.acts and "glibc" in effect.reason
        assert process_env({"reuse_memory": True}) == {}
        assert memory_reuse.apply(True) is False                            # nothing set, nothing claimed
    finally:
        memory_reuse.unavailable.cache_clear()


@glibc
@pytest.mark.skipif(threads.started_env().get(memory_reuse.MMAP_ENV) == "0",
                    reason="this test process started with MALLOC_MMAP_MAX_=0")
def test_a_later_session_without_it_restores_the_default_in_process():
    from trainfast import Session

    try:
        Session(Recipe(reuse_memory=True), env=False, device="cpu")
        assert memory_reuse.in_effect()
    finally:
        Session(Recipe(), env=False, device="cpu")
    assert not memory_reuse.in_effect()              # glibc's defaults back (mmap for large blocks, trimming)


@pytest.fixture(scope="module")
def digits_few(digits16):
    """The first 512 training digits (8 steps of 64) and 128 to validate on: the identity of two runs, and what a
    run records, show on any number of steps."""
    import dataclasses

    from trainfast.data.datasets import TensorImages

    train_set, val_set = digits16.train, digits16.val
    return dataclasses.replace(digits16, train=TensorImages(train_set.images[:512], train_set.labels[:512]),
                               val=TensorImages(val_set.images[:128], val_set.labels[:128]))


@glibc
def test_training_is_bit_identical_with_it(digits_few):
    from conftest import tiny_resnet

    from trainfast import Session, train

    weights = []
    for on in (False, True):
        recipe = Recipe(batch_size=64, epochs=1, reuse_memory=on)
        result = train(tiny_resnet, digits_few.train, digits_few.val, recipe=recipe, mean=digits_few.mean,
                       std=digits_few.std)
        assert memory_reuse.in_effect() is on
        weights.append({k: v.clone() for k, v in result.model.state_dict().items()})
    Session(Recipe(), env=False, device="cpu")       # a default run after it: this process's malloc restored
    assert not memory_reuse.in_effect()
    for name in weights[0]:
        assert torch.equal(weights[0][name], weights[1][name]), name


@glibc
@pytest.mark.skipif(threads.started_env().get(memory_reuse.MMAP_ENV) == "0",
                    reason="this test process started with MALLOC_MMAP_MAX_=0")
def test_a_rungs_process_sets_it_and_its_record_says_so(digits_few):
    """What a rung's process runs (ablation.rung.run_rung), here in this process: the rung's Session sets glibc's
    malloc and the run's record reads it back; the baseline's run, without it, restores glibc's defaults and
    records False."""
    from conftest import tiny_resnet

    from trainfast.ablation.rung import Job, run_rung

    job = Job(tiny_resnet, digits_few, device="cpu")
    try:
        rung = run_rung(job, Recipe(batch_size=64, reuse_memory=True), lambda event: None)
        assert rung["reuse_memory"] is True
    finally:
        baseline = run_rung(job, Recipe(batch_size=64), lambda event: None)
    assert baseline["reuse_memory"] is False and not memory_reuse.in_effect()


# Slow: a built-in ablation of the switch (its rung's process and the baseline's). Fast: the rung's process in this
# one, test_a_rungs_process_sets_it_and_its_record_says_so; the environment a command's rung starts with,
# test_a_command_starts_with_it_and_its_baseline_without.
@pytest.mark.slow
@glibc
def test_its_rung_runs_with_it_and_the_baseline_without(tmp_path, digits16):
    from conftest import ablate_one_switch

    result = ablate_one_switch(digits16, "reuse_memory", Recipe(batch_size=64), tmp_path)
    by_name = {r.name: r for r in result.rungs}
    assert result.settings["rungs"]["reuse_memory"]["reuse_memory"] is True
    assert by_name["reuse_memory"].status == "done"
    assert by_name["reuse_memory"].repeats[0]["reuse_memory"] is True
    assert by_name["baseline"].repeats[0]["reuse_memory"] is False
