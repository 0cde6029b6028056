"""The run record (probe/record.py): typed sections, each key with one writer. A record whose sections would write
the same key is refused rather than written with one number silently replacing another."""
from __future__ import annotations

import pytest

from trainfast.measure import StepTime
from trainfast.probe import MeasureSpec, Probe, RecordError, run_record
from trainfast.probe.record import Keys


class HandTimer:
    """The probe's step clock, fed by hand."""

    def __init__(self) -> None:
        self.steps, self.updates = [], 0

    def read(self) -> None:
        pass


def hand_probe(steps: int = 64) -> Probe:
    probe = Probe(MeasureSpec("", "full", steps=8, seconds=1.0, floor=4, min_seconds=0.1))
    probe.timer = HandTimer()
    for _ in range(steps):
        probe.timer.steps.append(StepTime(0.01, 16, 0.0))
        probe.timer.updates += 1
    return probe


def test_the_probe_writes_its_sections_and_a_run_adds_its_own_beside_them():
    record = run_record(hand_probe(), "end", task=Keys({"metric": {"name": "accuracy", "value": 0.5}}),
                        data=Keys({"skipped_files": 0}))
    assert record["steps_run"] == 64 and record["unit"] == "samples" and record["rate_unit"] == "samples/s"
    assert record["metric"]["value"] == 0.5 and record["skipped_files"] == 0
    assert "process_switches" in record and "timing" in record and "reported" in record


def test_a_run_that_declares_its_unit_has_it_written_by_the_rate_section_alone():
    probe = hand_probe()
    probe.unit = "tokens"                     # the built-in run: its task's clock counts tokens
    record = run_record(probe, "end")
    assert record["unit"] == "tokens" and record["rate_unit"] == "tokens/s"


@pytest.mark.parametrize("key", ["unit", "seed", "num_workers", "curve"])
def test_a_section_that_writes_another_sections_key_is_refused(key):
    with pytest.raises(RecordError, match=f"'{key}'"):
        run_record(hand_probe(), "end", curve=type("Curve", (), {"record": lambda self: {"curve": []}})(),
                   task=Keys({key: "again"}))


def test_only_a_task_over_image_files_counts_them():
    from trainfast.tasks import build_task

    lm, detection, classification = (build_task(name).build_file_counts()
                                      for name in ("lm", "detection", "classification"))
    assert lm.to_dict() == {} and lm.epoch_record(None, None, None) == {}       # no count, no collective
    assert detection.to_dict() == {"skipped_files": 0}                           # its images never decode on device
    assert set(classification.to_dict()) == {"skipped_files", "host_decoded_files", "host_decoded_named"}


def test_a_language_models_rung_and_epochs_pass_no_image_folder_stop(monkeypatch):
    import trainfast.data.badfiles as badfiles
    from test_lm import text_split

    from trainfast import Recipe, train
    from trainfast.ablation.rung import Job, run_rung

    def image_stop(*args, **kwargs):
        raise AssertionError("a language model's run counted image files")

    monkeypatch.setattr(badfiles, "reduce_counts", image_stop)      # every image-file count's all-reduce
    split, recipe = text_split(16, 8), Recipe(batch_size=8, epochs=1)
    record = run_rung(Job("llama-tiny", split, device="cpu", task="lm"), recipe, lambda e: None)
    assert not {"skipped_files", "host_decoded_files", "host_decoded_named"} & set(record)
    assert record["unit"] == "tokens" and record["metric"]["name"] == "validation loss"
    history = train("llama-tiny", split, recipe=recipe, device="cpu", task="lm").history
    assert not {"skipped_files", "val_skipped_files", "host_decoded_files"} & set(history[0])
