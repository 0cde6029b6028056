"""trainfast's counting hooks stay out of a compiled model's graph without importing dynamo in a run that never
compiles (instruments/eager.py)."""
from __future__ import annotations

import subprocess
import sys

SCRIPT = r"""
import sys
import torch
from torch import nn
from trainfast.instruments.eager import register_eager

calls = []
model = nn.Linear(4, 4)
handle = register_eager(model.register_forward_pre_hook, lambda module, args: calls.append(1))
model(torch.randn(2, 4))
assert "torch._dynamo" not in sys.modules, "registering the hook imported dynamo"
assert not hasattr(model._forward_pre_hooks[handle.id], "_torchdynamo_disable")

compiled = torch.compile(model, backend="eager")          # imports dynamo: the hook is disabled in its slot
assert getattr(model._forward_pre_hooks[handle.id], "_torchdynamo_disable", False)
compiled(torch.randn(2, 4))
assert len(calls) == 2, calls                             # it ran beside the compiled forward
handle.remove()
assert handle.id not in model._forward_pre_hooks
later = register_eager(model.register_forward_pre_hook, lambda module, args: None)  # dynamo there: disabled at once
assert getattr(model._forward_pre_hooks[later.id], "_torchdynamo_disable", False)
print("ok")
"""


def test_a_hook_is_disabled_for_compile_once_dynamo_is_imported_and_not_before():
    done = subprocess.run([sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=300)
    assert done.returncode == 0 and done.stdout.strip().endswith("ok"), done.stderr[-3000:]
