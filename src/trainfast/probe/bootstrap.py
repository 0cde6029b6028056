"""The bootstrap of a measured script: what trainfast's sitecustomize (_site/) runs as the command's Python starts.
Where TRAINFAST_MEASURE is set, it makes this process's Probe (agent.py), tells it about every Session the script
creates, hooks torch's global optimizer step for a script that creates none, sets the rung's process switches, and
writes the record at exit when the run ends by itself (full mode, or a speed run that ended before its budget).
"""
from __future__ import annotations

import atexit
import os
import sys

from ..techniques import apply_process_wide_switches
from .agent import Probe
from .contract import MeasureSpec

_PROBE: Probe | None = None
_LOADED = False


def current() -> Probe | None:
    """This process's probe when the ablation measures it (TRAINFAST_MEASURE is set), else None."""
    global _PROBE, _LOADED
    if not _LOADED:
        _LOADED = True
        spec = MeasureSpec.from_env()
        if spec is not None:
            _PROBE = Probe(spec)
            atexit.register(finish, _PROBE)
    return _PROBE


def install() -> None:
    """What trainfast's sitecustomize calls in a measured run: the probe, told about every Session the script
    creates (observers.py), with its global optimizer hook for a script that creates none."""
    probe = current()
    if probe is not None:
        from torch.optim.optimizer import register_optimizer_step_post_hook

        from ..instruments.batches import BatchKind
        from ..printedmetric import PrintedMetric
        from ..observers import observe_sessions
        from .inject import install as install_plain
        from .observe import Observer
        from .printed import install as read_printed

        observe_sessions(probe)
        probe.observer = Observer().install()        # what the run did, observed (the record's "observed")
        probe.observer.loader_listeners.append(probe.other_passes)     # evaluations left out of the training rate
        install_plain(probe, probe.observer)         # a plain loop: the run's switches through the Observer's hooks
        register_optimizer_step_post_hook(probe._global_step)
        read_printed(probe, PrintedMetric.from_dict(probe.spec.printed_metric))    # --metric on its output
        # The task the script's batches are (its ladder, ablation/work.py); its first training forward
        probe.batches = BatchKind(on_start=probe.training_began)
        apply_command_switches()


def apply_command_switches() -> None:
    """The run's process switches, set in the command's process as soon as it starts (torch is loaded here): a
    script with neither a Session nor a framework adapter gets them too, and a library-wide flag with no variable
    to start with (fp32 matmuls in a reduced type) reaches it. A script that changes one back is caught by the
    read-back at its end."""
    from ..recipe import RecipeError, env_recipe_fields

    try:
        fields = env_recipe_fields()
    except RecipeError:
        return                             # the Session, if there is one, says what is wrong with it
    apply_process_wide_switches(fields, warn=False)


def finish(probe: Probe) -> None:
    """Full mode (or a speed run that ended before its budget): the result as the run ends. A process that
    never stepped (a DataLoader worker, the torchrun launcher) writes nothing. Registered before the
    script ran, so it runs after every other exit handler: the last chance to let a process group's
    workers finish (a script that opened its own group and never closes it)."""
    if not probe.written and probe.timer is not None and probe.timer.updates:
        try:
            probe.write("script ended")
        except Exception as exc:        # at exit nothing else can report it
            print(f"trainfast: could not write the measurement {probe.spec.result}: {exc}", file=sys.stderr)
    from ..distributed import drain_collectives

    drain_collectives()
    if probe.stopped_ranks:
        # Every exit handler has run (this one was registered first) and the result is written. The
        # interpreter's own shutdown is skipped: a gloo worker still freeing the stop agreement's tensors
        # needs the GIL, which finalization no longer gives, and the rank aborted (exit -6, seen in CI).
        sys.stdout.flush()
        sys.stderr.flush()
        os._exit(0)
