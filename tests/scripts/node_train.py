"""`trainfast train` as one node's process of a job of several, with each rank's training shard recorded: every
index DistributedSampler hands this global rank is appended to SHARD_DIR/rank{RANK}.json (with its node, torchrun's
GROUP_RANK), then the CLI runs as `python -m trainfast train ARGS` would."""
import json
import os
import sys
from pathlib import Path

from torch.utils.data import DistributedSampler

from trainfast.cli import main

plain_iter = DistributedSampler.__iter__


def recorded_iter(self):
    indices = list(plain_iter(self))
    path = Path(os.environ["SHARD_DIR"]) / f"rank{os.environ['RANK']}.json"
    seen = json.loads(path.read_text()) if path.exists() else {"node": os.environ["GROUP_RANK"], "epochs": []}
    seen["epochs"].append({"sampler_rank": self.rank, "indices": indices})
    path.write_text(json.dumps(seen))
    return iter(indices)


DistributedSampler.__iter__ = recorded_iter
sys.exit(main(["train", *sys.argv[1:]]))
