"""The measuring instrument: step windows timed after a device sync, metrics accumulated on the device
and read once per window, peak memory, model FLOPs and the device's matmul ceiling. One module per concern:

  clock.py    the step clock: each step's end and its wait for input (StepTimer, StepClock, InputSpan)
  meter.py    loss and accuracy on the device, read once per window (Meter, EpochStats); the loss errors
  timing.py   a run's steady state: warm-up, disturbed blocks left out, the rate (Timing, steps_to_time)
  device.py   peak memory, a model's training FLOPs, the matmul ceiling (measure_ceiling, runs_tf32)

Every public name is re-exported here, where the rest of trainfast reads it (`from .measure import Meter`):
a test that swaps one of them (the matmul ceiling) swaps it here."""
from .clock import (InputSpan, StepClock, StepTime, StepTimer, batch_samples, machine_busy_seconds, read_spans,
                    synchronize)
from .device import count_train_flops, measure_ceiling, peak_memory_bytes, reset_peak_memory, runs_tf32
from .meter import EpochStats, LossTermsError, Meter, NonFiniteLossError, Window, count_correct, local_terms
from .timing import BLOCK_SECONDS, DISTURBED_SHARE, Timing, detect_warmup, step_block, steps_to_time

__all__ = [
    "InputSpan", "StepClock", "StepTime", "StepTimer", "batch_samples", "machine_busy_seconds", "read_spans",
    "synchronize",
    "count_train_flops", "measure_ceiling", "peak_memory_bytes", "reset_peak_memory", "runs_tf32",
    "EpochStats", "LossTermsError", "Meter", "NonFiniteLossError", "Window", "count_correct", "local_terms",
    "BLOCK_SECONDS", "DISTURBED_SHARE", "Timing", "detect_warmup", "step_block", "steps_to_time",
]
