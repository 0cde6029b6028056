"""The ablation: a ladder of rungs (recipes), each run in fresh processes, interleaved, scored with intervals
and verdicts, and the recommendation.

  ladders.py  which rungs, in what order, each rung's recipe (plan_rungs)
  work.py     the kinds of work behind one protocol: the built-in run, a user's command
  rung.py     inside a rung's process: the built-in run trained, evaluated and timed
  server.py   the fork server rung processes start from
  loop.py     the interleaved loop, its time budget and settling (LadderRun)
  spending.py a ladder's time: the plan cut to its budget, each run priced before it starts, where it stopped
  clock.py    the one clock a ladder and a search are priced by (RunClock): time left, each run kind's cost
  scoring.py  runs -> numbers, verdicts, the recommendation (pure functions)
  store.py    the run folder: plan.json and one record per finished run, for --resume
  api.py      ablate() and ablate_command()
"""
from ..results import AblationResult, Rung
from .api import ablate, ablate_command
from .ladders import DETECTION_LADDER, LADDER, LADDER_MODES, RUNGS, plan_rungs
from .loop import LadderOptions, run_ladder
from .rung import TimingBudget

__all__ = ["ablate", "ablate_command", "AblationResult", "Rung", "LADDER", "DETECTION_LADDER", "LADDER_MODES",
           "RUNGS", "plan_rungs", "LadderOptions", "run_ladder", "TimingBudget"]
