"""Imported at start-up by every Python process of a run that `trainfast ablate -- COMMAND` measures (the
ablation puts this folder first on PYTHONPATH). It installs trainfast's probe (probe/bootstrap.py), whose global
optimizer-step hook times a script that never creates a trainfast.Session, then imports the sitecustomize
this one shadows, if there is one, so a site's own start-up code still runs. Under `trainfast doctor -- COMMAND`
it starts the doctor's Watch instead (doctor.install_in_script)."""
import importlib.machinery
import importlib.util
import os
import sys


def _chain() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    others = [p for p in sys.path if os.path.abspath(p or os.getcwd()) != here]
    spec = importlib.machinery.PathFinder.find_spec("sitecustomize", others)
    if spec is not None and spec.loader is not None:
        module = importlib.util.module_from_spec(spec)
        sys.modules["sitecustomize"] = module
        spec.loader.exec_module(module)


if os.environ.get("TRAINFAST_MEASURE"):
    from trainfast import probe

    probe.install()
    from trainfast import frameworks  # a Trainer, Lightning or Accelerate script: switched from inside

    frameworks.install_from_env(probe.current())
if os.environ.get("TRAINFAST_DOCTOR"):          # `trainfast doctor -- COMMAND`: the Watch (doctor/script.py)
    from trainfast import doctor

    doctor.install_in_script()
_chain()
