"""The doctor's progress (doctor/progress.py): its passes as steps done of planned with the time left, shown by the
same bar and plain lines as ablate's runs (report/runsbar.py); a script's steps read from the file its process
writes. Off a terminal: plain lines, no redraws."""
import io
import json

import pytest
from conftest import tiny_resnet
from rich.console import Console

from trainfast.doctor import observe_builtin
from trainfast.doctor.progress import DoctorProgress, ScriptSteps
from trainfast.recipe import Recipe
from doctor_kit import tiny_split
from doctor_kit import no_load_window  # noqa: F401  (autouse: no load window before the timed steps)


def plain() -> tuple[DoctorProgress, io.StringIO]:
    out = io.StringIO()
    return DoctorProgress(Console(file=out, width=80)), out


def test_the_built_in_doctor_says_each_pass_with_the_steps_left_and_the_time():
    progress, out = plain()
    with progress:
        observe_builtin(lambda: tiny_resnet(10), tiny_split(), recipe=Recipe(batch_size=8, log_every=4),
                        device="cpu", steps=6, flops=False, progress=progress)
    lines = out.getvalue().splitlines()
    assert "\x1b[" not in out.getvalue()                      # plain: no colour, no redraws
    # 1 + 4 watched, the evaluation, 6 timed beside 6 replayed, the memory step: 19 (no profile, no FLOPs on CPU)
    assert lines[0] == ("running the first 5 steps, watched (syncs, shapes, gradients) … (1 of 19 steps, time left "
                        "after the first of them)"), lines        # one line each, however narrow the console
    timed = next(line for line in lines if line.startswith("running 6 timed steps"))
    assert "(7 of 19 steps, ~" in timed and " left)" in timed, lines       # priced by the steps measured so far
    assert lines[-1].startswith("running one more step, its memory by what holds it … (19 of 19 steps, ~"), lines
    assert progress.runs.done == 19 and progress.runs.planned == []
    priced = {key for _, key in progress.runs.costs.runs}
    assert priced == {"watched", "evaluation", "timed", "replay", "memory"}        # the first step: no price


def test_a_scripts_steps_are_read_from_its_file_and_priced_by_its_clock(tmp_path):
    progress, out = plain()
    steps_file, result = tmp_path / "progress.json", tmp_path / "observations.json"
    seen = ScriptSteps(progress, steps_file, result, eval_within=30.0)
    with progress:
        progress.plan([("first step", 1), ("step", 20)])
        progress.start("the script: its start-up and first step")
        seen.poll()                                                # nothing written yet
        steps_file.write_text(json.dumps({"steps": 1, "first_end_s": 4.0, "last_end_s": 4.0}))
        seen.poll()
        steps_file.write_text(json.dumps({"steps": 11, "first_end_s": 4.0, "last_end_s": 5.0}))
        seen.poll()
        assert progress.runs.left_s() == pytest.approx(10 * 0.1)  # ten steps left at 0.1 s each
        assert "first step" not in {key for _, key in progress.runs.costs.runs}   # start-up prices no other step
        result.write_text("{}")                                    # the watched steps are over
        seen.poll()
        seen.poll()                                                # said once
    lines = out.getvalue().splitlines()
    assert lines == ["running the script: its start-up and first step … (1 of 21 steps, time left after the first "
                     "of them)",
                     "running the script's steps, watched (syncs, shapes, gradients), then timed … (2 of 21 steps, "
                     "time left after the first of them)",
                     "running the script kept going for its first evaluation (untimed, up to 30 s) … (21 of 21 "
                     "steps, ~0 s left)"], lines
    assert progress.runs.done == 21


def test_the_doctor_and_ablate_share_one_bar():
    from trainfast.report.live import Display
    from trainfast.report.runsbar import RunsBar

    shown = Display([], {}, {"device_name": "cpu", "device": "cpu"}, console=Console(file=io.StringIO()))
    assert isinstance(shown.bar, RunsBar) and isinstance(plain()[0].bar, RunsBar)
    assert shown.bar.runs is shown.runs and not shown.bar.describe       # the rung's own bar says what runs
