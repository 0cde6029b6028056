import json
import os
import pickle
import subprocess
import sys
import zlib
from pathlib import Path
from typing import Any, Callable

# The suite runs on the CPU on every machine, a GPU machine too: its exact assertions (bit parity with a plain
# loop, the doctor's CPU verdicts, which switch acts where) are the CPU's. The GPU is hidden here, before torch
# starts CUDA, from this process and every process a test starts. The CUDA paths are checked with the GPU
# visible by the tests marked `cuda` (`make test-cuda`, which sets TRAINFAST_TEST_CUDA=1) and `trainfast selfcheck`.
CUDA_RUN = os.environ.get("TRAINFAST_TEST_CUDA") == "1"
if not CUDA_RUN:
    os.environ["CUDA_VISIBLE_DEVICES"] = ""
# On several pytest-xdist workers (`make test`), each worker and every process its tests start share the cores with
# the other workers: a worker's OpenMP threads are its share, set before torch starts its pool, unless the user set
# them (as distributed.rank_threads does for ranks). Two workers of two threads each on 2 cores spin on each other's
# barriers (the fast suite measured slower than one worker).
WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "1"))
if WORKERS > 1 and "OMP_NUM_THREADS" not in os.environ:
    from trainfast.defaults import usable_cpus      # torch-free: torch is not loaded yet

    os.environ["OMP_NUM_THREADS"] = str(max(1, usable_cpus() // WORKERS))

import numpy as np
import pytest
import torch

from trainfast.data.datasets import Split, load_digits
from trainfast.models import resnet9
from trainfast.recipe import Recipe
from trainfast.stats import Repeat

ROOT = Path(__file__).resolve().parents[1]


def tiny_conv() -> torch.nn.Module:
    """Conv, BatchNorm (running statistics in the state), ReLU, pooling, a linear head: a few hundred weights."""
    return torch.nn.Sequential(torch.nn.Conv2d(3, 8, 3, padding=1), torch.nn.BatchNorm2d(8), torch.nn.ReLU(),
                               torch.nn.AdaptiveAvgPool2d(1), torch.nn.Flatten(), torch.nn.Linear(8, 10))


def tiny_resnet(num_classes: int = 10) -> torch.nn.Module:
    """The default architecture at a fraction of its width: same layers (conv, BN, residual), fast on CPU."""
    return resnet9(num_classes, widths=(8, 16, 16, 32))


def fresh_python(code: str, drop: tuple[str, ...] = (), **env: str):
    """Run `code` in a new interpreter (its own OpenMP and malloc start) without the variables `drop` and with
    `env` added (a "" value: left out); its last line of output, parsed as JSON."""
    environ = {k: v for k, v in os.environ.items() if k not in drop}
    environ.update({k: v for k, v in env.items() if v})
    environ["PYTHONPATH"] = str(ROOT / "src") + os.pathsep + environ.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, "-c", code], env=environ, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    return json.loads(out.stdout.strip().splitlines()[-1])


def ablate_one_switch(split, switch: str, recipe, out):
    """The built-in ablation of one switch (its rung and the baseline, one repeat each) on the tiny ResNet and
    `split`'s datasets: what a switch's own rung tests run. They check that each run ran and with what, not its
    speed: so one pass exactly (no passes added to settle a verdict) and a timing budget of a few steps."""
    from trainfast import ablate
    from trainfast.ablation.rung import TimingBudget

    return ablate(tiny_resnet, split.train, split.val, recipe=recipe, out=out, rungs=[switch], repeats=1,
                  noise_seeds=1, show=False, mean=split.mean, std=split.std, settle_within_s=0,
                  budget=TimingBudget(steps=4, seconds=1.0, floor=2, min_seconds=0.0))


@pytest.fixture(autouse=True)
def _decode_cache_in_tmp(tmp_path, monkeypatch):
    """Decode caches built by any test go to its own temporary folder, never the user's ~/.cache."""
    monkeypatch.setenv("TRAINFAST_CACHE", str(tmp_path / "trainfast-cache"))


@pytest.fixture(scope="session")
def _loader_iterators():
    """The DataLoader iterators with worker processes started since the last test ended (held weakly), each with
    its loader (weakly): the patched constructor notes them for the whole run, each test's end empties it."""
    import weakref

    from torch.utils.data import dataloader

    started = weakref.WeakKeyDictionary()
    real_init = dataloader._MultiProcessingDataLoaderIter.__init__

    def init(self, loader):
        real_init(self, loader)
        started[self] = weakref.ref(loader)

    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(dataloader._MultiProcessingDataLoaderIter, "__init__", init)
        yield started


@pytest.fixture(autouse=True)
def _loader_workers_shut_at_the_tests_end(_loader_iterators):
    """Loader workers a test leaves running (a script run in this process: the agent's objects keep the script's
    loader, with its persistent workers or its iterator stopped mid-epoch, until they are collected) are shut down
    at the test's end, as a process's exit would; a later pass over a persistent loader starts new workers. Left
    to the garbage collector, torch's shutdown waits 5 s for each worker and then kills it (the collection
    finalizes the index queues' feeder threads before the iterator's __del__ sends the workers their stop): a
    wait that fell on whichever test the collection happened to run in."""
    yield
    for iterator, loader_ref in list(_loader_iterators.items()):
        iterator._shutdown_workers()                      # a no-op for one that shut itself (an epoch's end)
        loader = loader_ref()
        if loader is not None and getattr(loader, "_iterator", None) is iterator:
            loader._iterator = None
    _loader_iterators.clear()


@pytest.fixture(scope="session", autouse=True)
def _matmul_peak_measured_once():
    """The matmul peak (up to a second of products per ablation ladder or doctor run) measured once per device,
    dtype, size and thread count for the whole test run: every run still gets a real measured peak, the suite
    does not measure the same one hundreds of times. test_measure checks the measurement itself (it holds the
    function imported before this patch)."""
    import functools

    import trainfast.ablation.loop
    import trainfast.doctor.peaks
    import trainfast.measure

    @functools.lru_cache(maxsize=None)
    def peak(threads, *args, **kwargs):
        return real(*args, **kwargs)

    def measure_ceiling(*args, **kwargs):
        return peak(torch.get_num_threads(), *args, **kwargs)

    real = trainfast.measure.measure_ceiling
    with pytest.MonkeyPatch.context() as patch:
        for module in (trainfast.measure, trainfast.ablation.loop, trainfast.doctor.peaks):
            patch.setattr(module, "measure_ceiling", measure_ceiling)
        yield


@pytest.fixture(scope="session", autouse=True)
def _reference_workload_timed_once():
    """The machine's reference workload (procstate.reference_check: eight timings of 40 fp32 512x512 products,
    about half a second on 2 cores, before a ladder's first run and after its last) timed once per device and
    thread count for the whole test run: every in-process ladder still gets a real measurement at both ends (its
    report's machine line, from the same numbers at each end), the suite does not time the same workload twice per
    ladder hundreds of times. test_noise checks the measurement itself (procstate's own function, not patched);
    an ablation in its own process (the CLI, tune) still times it at both ends."""
    import functools

    import trainfast.ablation.loop

    @functools.lru_cache(maxsize=None)
    def timed(threads, device):
        return real(device)

    def reference_check(device=None):
        return dict(timed(torch.get_num_threads(), device))

    real = trainfast.ablation.loop.reference_check
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(trainfast.ablation.loop, "reference_check", reference_check)
        yield


def made_once(tmp_path_factory, name: str, make: Callable[[], Any]) -> Any:
    """`make()` once for the whole run, for a fixture whose tests pytest-xdist may hand to several workers (`make
    test-all` spreads the slow tests over one worker a core): the first worker to ask makes it under a file lock in
    the run's temporary folder, the others wait for it and read it back (pickled). A run that several tests read
    (an ablation's folder and its results) costs one run, not one a worker. Without workers: `make()`."""
    if "PYTEST_XDIST_WORKER" not in os.environ:
        return make()
    from filelock import FileLock

    shared = tmp_path_factory.getbasetemp().parent          # above each worker's own folder: the run's
    with FileLock(str(shared / f"{name}.lock")):
        kept = shared / f"{name}.pickle"
        if kept.exists():
            return pickle.loads(kept.read_bytes())
        value = make()
        kept.write_bytes(pickle.dumps(value))
        return value


@pytest.fixture(scope="session")
def hf_trainer_ablation(tmp_path_factory):
    """One `trainfast ablate` of examples/hf_trainer.py (amp, set_to_none and fused, one run each) for the tests
    that read what it wrote: test_fw_hf (each rung's switches read back, the script's settings in the report) and
    test_track (the ablation and the script's own runs grouped in MLflow): one ablation, not one each. The script's
    Trainer reports to MLflow as a user sets it (report_to="mlflow", its one changed line) and the ablation runs
    with --track mlflow into a file store beside it; without mlflow installed, the example as it is, untracked
    (test_track's test skips). (the ablation's folder, its results.json, the MLflow tracking URI or None)"""
    pytest.importorskip("transformers")
    return made_once(tmp_path_factory, "hf_trainer_ablation", lambda: ablate_hf_trainer(tmp_path_factory))


def ablate_hf_trainer(tmp_path_factory):
    import importlib.util

    from test_ablate_command import ablate

    root = tmp_path_factory.mktemp("hf-trainer")
    script, flags, uri = ROOT / "examples" / "hf_trainer.py", [], None
    if importlib.util.find_spec("mlflow") is not None:
        code = script.read_text()
        assert 'report_to="none"' in code
        script = root / "train_hf.py"
        script.write_text(code.replace('report_to="none"', 'report_to="mlflow"'))
        uri, flags = (root / "mlruns").as_uri(), ["--track", "mlflow"]
    out = root / "ablate-hf"
    with pytest.MonkeyPatch.context() as patch:
        if uri:
            patch.setenv("MLFLOW_TRACKING_URI", uri)
            patch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")      # mlflow 3 keeps file stores behind this
        patch.chdir(root)
        _, results = ablate(out, *flags, "--switches", "amp,set_to_none,fused", "--repeats", "1",
                            "--noise-seeds", "1", "--settle-within", "0",
                            command=[sys.executable, str(script), "--train-size", "1536", "--output-dir",
                                     str(root / "hf")])
    return out, results, uri


@pytest.fixture(scope="session")
def digits16() -> Split:
    """The real built-in dataset at 16 px: small enough that a full epoch takes about a second."""
    return load_digits(16)


def pytest_collection_modifyitems(config, items):
    for item in items:
        if "alone" in item.keywords and "slow" not in item.keywords:
            # `make test` runs every test not marked slow on its workers, beside each other
            raise pytest.UsageError(f"{item.nodeid} is marked alone but not slow: `make test` would run it beside "
                                    "other tests")
        cuda = "cuda" in item.keywords
        if not CUDA_RUN and cuda:
            reason = "needs a CUDA device (make test-cuda on a GPU machine)"
        elif CUDA_RUN and not torch.cuda.is_available():
            reason = "torch sees no CUDA device"
        elif CUDA_RUN and not cuda:     # make test-cuda: the CUDA tests alone; the rest are the CPU suite's
            reason = "the CPU suite runs with the GPU hidden: make test"
        else:
            continue
        item.add_marker(pytest.mark.skip(reason=reason))


# --- synthetic measurements (the truth is known) ---------------------------------------------------

class VirtualTime:
    """The `time` module as trainfast's clocks see it (measure.clock, the doctor's watches), its perf_counter moved
    only by the test (`advance`, or `sleep`: a slow read or a step of known length, whatever the machine);
    everything else is the real `time`. Patched in where a module reads `time`."""

    def __init__(self) -> None:
        self.now = 1000.0

    def perf_counter(self) -> float:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += seconds

    sleep = advance

    def __getattr__(self, name):
        import time

        return getattr(time, name)


RNG = np.random.default_rng(0)


def noisy_repeat(rate: float, blocks: int = 8, noise: float = 0.03, samples: int = 192, rng=None) -> Repeat:
    """A repeat whose blocks run at `rate` samples/s with multiplicative noise (from `rng`, else the suite's shared
    generator: a test that asserts on the noise's size passes its own, so the tests run before it do not move it)."""
    seconds = samples / rate * (1 + noise * (rng or RNG).standard_normal(blocks))
    return Repeat(tuple((samples, float(s)) for s in seconds))


def scored_rung(name: str, rates: list[float], accuracy: float, **changes):
    """A finished rung with one synthetic repeat per rate (repeat i: seed i), as score_rungs reads them."""
    from trainfast.results import Rung

    rung = Rung(name, changes, Recipe(**changes), status="done")
    # its noise drawn from its own name and rates, so what a test asserts does not depend on the tests run before
    rng = np.random.default_rng(zlib.crc32(f"{name}:{rates}".encode()))
    for seed, rate in enumerate(rates):
        rep = noisy_repeat(rate, rng=rng)
        blocks = [{"samples": n, "seconds": s, "disturbed": False, "steps": 3, "foreign_share": 0.0}
                  for n, s in rep.blocks]
        rung.repeats.append({"seed": seed, "accuracy": accuracy, "loss": 0.3, "train_loss": 0.3, "epoch_time_s": 1.0,
                             "peak_memory_bytes": 2**28, "data_wait_fraction": 0.0, "skipped_files": 0,
                             "val_samples": 400, "world_size": 1, "num_workers": 0, "precision_state": {}, "steps": 10,
                             "train_losses": [], "timing": {"blocks": blocks, "warmup_steps": 1, "timed_steps": 24,
                                                            "timed_seconds": 1.0, "disturbed_steps": 0}})
    return rung


def save_png(image, path: str) -> None:
    """A uint8 [3, H, W] tensor as a PNG file, through Pillow (torchvision.io's encoders are deprecated)."""
    from PIL import Image

    Image.fromarray(image.permute(1, 2, 0).contiguous().numpy()).save(path)


def torchrun_env() -> dict:
    """The environment a test's torchrun job starts with: this checkout's trainfast and tests importable, one
    thread per rank (two ranks share 2 cores), and no rendezvous variables inherited from an outer job."""
    import os
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    e = dict(os.environ)
    e["PYTHONPATH"] = os.pathsep.join([str(root / "src"), str(root / "tests"), e.get("PYTHONPATH", "")])
    e["OMP_NUM_THREADS"] = "1"
    for key in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        e.pop(key, None)
    return e


def saved_bytes(model: torch.nn.Module, step) -> int:
    """Bytes of the storages saved for backward while `step()` runs its forward, each storage once and the
    parameters' left out (they are held anyway): a deterministic count of what the graph keeps alive, not a timing
    or an allocator's reading."""
    weights = {p.untyped_storage().data_ptr() for p in model.parameters()}
    kept: dict[int, int] = {}

    def pack(tensor: torch.Tensor) -> torch.Tensor:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in weights:
            kept[storage.data_ptr()] = storage.nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        loss = step()
    assert loss.requires_grad          # the graph (and what it keeps) is alive while the bytes are counted
    return sum(kept.values())
