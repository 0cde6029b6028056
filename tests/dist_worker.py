"""Worker for tests/test_distributed.py, launched by torchrun (`python -m torch.distributed.run ...
tests/dist_worker.py SCENARIO OUT [key=value ...]`). Each rank writes OUT/rank{R}.json with what the test
checks; rank 0's run folder (model.pt) is OUT/run."""
from __future__ import annotations

import json
import os
import sys
import time
import warnings
from pathlib import Path

import torch
from torch import nn

sys.path.insert(0, str(Path(__file__).parent))
from dist_common import make_model, make_split  # noqa: E402

from trainfast import Recipe, train  # noqa: E402
from trainfast.distributed import drain_collectives  # noqa: E402
from trainfast.measure import NonFiniteLossError  # noqa: E402


class Sabotage(nn.Module):
    """Wraps the model: on `rank`, at forward call `at`, returns NaN logits ("nan") or goes silent ("hang")."""

    def __init__(self, model: nn.Module, rank: int, at: int, kind: str) -> None:
        super().__init__()
        self.model, self.calls = model, 0
        self.active = int(os.environ["RANK"]) == rank
        self.at, self.kind = at, kind

    def forward(self, x):
        self.calls += 1
        out = self.model(x)
        if self.active and self.calls == self.at:
            if self.kind == "hang":
                time.sleep(120)
            out = out * float("nan")
        return out


SCENARIOS = {                       # name -> (worker options); the test compares their results
    "ddp": {},
    "accum": {"batch": 4, "accum": 2},  # 2 ranks x 2 micro-batches of 4 = the same global batch of 16
    "fsdp": {"strategy": "fsdp"},
    "unused": {"unused": 1},
    "nan": {"sabotage": "nan"},
    "hang": {"sabotage": "hang", "timeout": 15},   # generous: a loaded machine must not look silent
    "session": {"loop": "session"},                # a user's own loop adopted with trainfast.Session
    "session_fsdp": {"loop": "session", "strategy": "fsdp"},
}


def session_loop(recipe: Recipe, out: Path) -> dict:
    """A user's loop: a plain shuffled DataLoader and SGD, adopted with the three Session lines (plus tf.log).
    The Session shards the loader (DistributedSampler, set_epoch) and wraps the model (DDP or FSDP2, the
    user's optimizer remapped onto FSDP2's shards)."""
    from dist_common import MEAN, STD
    from torch.utils.data import DataLoader

    from trainfast import Session
    from trainfast.checkpoint import atomic_save

    tf = Session(recipe, device="cpu")
    model = make_model()
    optimizer = torch.optim.SGD(model.parameters(), lr=recipe.lr, momentum=0.9, weight_decay=0.0)
    loader = DataLoader(make_split().train, batch_size=recipe.batch_size, shuffle=True)
    model, optimizer, loader = tf.setup(model, optimizer, loader, mean=MEAN, std=STD)
    for inputs, targets in loader:
        optimizer.zero_grad()
        loss = nn.functional.cross_entropy(model(inputs), targets)
        tf.backward(loss)
        optimizer.step()
        tf.log(loss=loss)
    weights = tf.dist.full_state_dict(tf.state.model)      # collective under FSDP2
    if tf.is_main:
        atomic_save(weights, out / "model.pt")
    return {"steps": tf.state.step, "logged": tf.flush_logs(), "batches": len(loader),
            "sampler": type(loader.sampler).__name__}


def run(scenario: str, out: Path) -> dict:
    opts = SCENARIOS[scenario]
    rank = int(os.environ["RANK"])
    recipe = Recipe(optimizer="sgd", lr=0.05, weight_decay=0.0, batch_size=opts.get("batch", 8), epochs=1,
                    log_every=2, strategy=opts.get("strategy", "ddp"), grad_accum_steps=opts.get("accum", 1),
                    dist_timeout_s=opts.get("timeout", 60))
    report = {"rank": rank, "world": int(os.environ["WORLD_SIZE"])}
    model = make_model(unused=bool(opts.get("unused")))
    if "sabotage" in opts:
        model = Sabotage(model, rank=1, at=5, kind=opts["sabotage"])
    try:
        if opts.get("loop") == "session":
            (out / scenario).mkdir(parents=True, exist_ok=True)
            report.update(session_loop(recipe, out / scenario))
        else:
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                result = train(model, make_split(), recipe=recipe, device="cpu", out=out / scenario)
            report["warnings"] = [str(w.message) for w in caught]
            report["steps"] = result.state.step
            report["history"] = result.history
    except Exception as exc:  # the test reads what each rank saw
        report["error"] = f"{type(exc).__name__}: {exc}"
        report["nonfinite"] = isinstance(exc, NonFiniteLossError)
    (out / scenario).mkdir(parents=True, exist_ok=True)
    (out / scenario / f"rank{rank}.json").write_text(json.dumps(report))
    return report


def main() -> None:
    """OUT SCENARIO[,SCENARIO...]: several scenarios share one launch (torch imports dominate a launch on
    a loaded 2-core machine); the process group is opened here, so train() uses it and leaves it open."""
    out, scenarios = Path(sys.argv[1]), sys.argv[2].split(",")
    if "hang" not in scenarios:
        torch.distributed.init_process_group("gloo")
    reports = [run(name, out) for name in scenarios]
    if torch.distributed.is_initialized():
        drain_collectives()     # else a rank may abort at exit ("terminate called without an active exception")
        torch.distributed.destroy_process_group()
    sys.exit(3 if any("error" in r for r in reports) else 0)


if __name__ == "__main__":
    main()
