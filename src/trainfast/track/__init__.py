"""Results in the tracker a team already uses: `--track mlflow|wandb|tensorboard` for ablate, tune and train.

One group per command: a parent run (the ablation, the tune, the training run) with the command's settings as
params, one child per rung or candidate with its switches as params, its figures as metrics (rate, speed-up with
its interval, verdict, peak memory, the judged metric, time to target) and its words as tags, fed from the same
results object results.json is written from, after every judged run and at the end; the report and charts as
artifacts. A script that logs to a tracker itself finds, in each run's environment, the child its own runs belong
under (W&B's group, MLflow's parent run). No tracker library is a dependency: each is imported when asked for.

  names.py        --track's names and the tracker the environment points at (no torch, no tracker library)
  base.py         Tracker: the small interface every tracker offers; load_tracker, TrackError
  figures.py      results.json's entries as params, metrics and tags (pure functions)
  tracking.py     Tracking: several trackers as one group; track_results (a finished results.json)
  ladder.py       LadderTracking: an ablation's loop feeding a Tracking (imported by the ablation itself: it
                  reads the report's entries, which load torch; this package's names load neither)
  mlflow.py, wandb.py, tensorboard.py   one module per tracker
"""
from .base import Tracker, TrackError, load_tracker
from .names import TRACKERS, choose_trackers, from_environment, parse_track
from .tracking import Tracking, track_results

__all__ = ["TRACKERS", "Tracker", "TrackError", "Tracking", "choose_trackers", "from_environment",
           "load_tracker", "parse_track", "track_results"]
