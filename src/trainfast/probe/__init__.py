"""The probe: how a run measured by the ablation reports back (`trainfast ablate -- COMMAND`, and the built-in
ablation's runs, which are the same kind of run). One job per module:
  contract.py   what the parent puts in the run's environment (TRAINFAST_MEASURE), how a timed run ends (StopRun),
                and where and how the run writes its record
  agent.py      the Probe: the in-process timing agent (its step clock, speed mode's stop)
  record.py     the run record: typed sections, each key with one writer
  bootstrap.py  what a measured script's start-up runs (the probe, its hooks, its record at exit)
  ranks.py      several ranks: each one's own phases timed, every rank's figures gathered and judged
"""
from .agent import CHECK_EVERY, MAX_BUDGETS, LoaderWorkers, Probe
from .bootstrap import apply_command_switches, current, install
from .contract import MEASURE_ENV, PROBE_MODES, MeasureError, MeasureSpec, StopRun
from .ranks import agree_max, collect_ranks
from .record import PROCESS_SWITCHES, WRAP_SWITCHES, RecordError, RunRecord, compile_counters, run_record, run_seed

__all__ = ["CHECK_EVERY", "MAX_BUDGETS", "LoaderWorkers", "Probe", "apply_command_switches", "current", "install",
           "MEASURE_ENV", "PROBE_MODES", "MeasureError", "MeasureSpec", "StopRun", "PROCESS_SWITCHES", "WRAP_SWITCHES",
           "RecordError", "RunRecord", "agree_max", "collect_ranks", "compile_counters", "run_record", "run_seed"]
