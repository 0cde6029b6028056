"""`trainfast doctor`: what holds this run back, and the mistakes in it, from a short, bounded run.

Three observers run a loop under the Watch (instruments/watch.py) and return what they measured (Observations); checks/
turns those into ranked Findings. One module per observer, beside what they share:
  builtin.py   the built-in run (same model/data/recipe flags as `train`), in three short passes
  loop.py      a user's own loop, in this process (observe_loop)
  script.py    a user's script in a subprocess: `trainfast doctor -- python train.py` (observe_script)
  common.py    what every observer adds alike: the watch's findings, the evaluation, page faults, memory
  peaks.py     FLOPs per sample, and the matmul peaks they are compared with
  output.py    the ranked findings printed and written (doctor.json, a report's doctor section): doctor()
"""
from .builtin import observe_builtin, watch_steps
from .common import DEFAULT_EVAL_WITHIN, DEFAULT_STEPS
from .loop import observe_loop
from .output import doctor, print_findings, write_doctor
from .script import ScriptFailed, install_in_script, observe_script

__all__ = ["DEFAULT_EVAL_WITHIN", "DEFAULT_STEPS", "ScriptFailed", "doctor", "install_in_script", "observe_builtin",
           "observe_loop", "observe_script", "print_findings", "watch_steps", "write_doctor"]
