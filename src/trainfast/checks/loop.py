"""Mistakes in the training loop's own code: constants copied from the host every step, gradients zeroed in
place, DataParallel, cudnn.benchmark with changing input shapes."""
from __future__ import annotations

from typing import Any

from .findings import MATERIAL_SHARE, NOT_HERE, VARYING_SHAPES, Finding, Observations, ms, pct


def host_copies(obs: Observations) -> Finding:
    name = "tensors created on the host and copied every step"
    if not obs.cuda:
        return Finding(name, "mistake", NOT_HERE, "host-to-device copies only exist with a GPU")
    p = obs.cuda_profile or {}
    if p.get("h2d_per_step") is None:
        return Finding(name, "mistake", NOT_HERE, f"the CUDA profile did not run: {p.get('error', 'no profile')}")
    extra = p["h2d_per_step"] - p.get("batch_tensors", 0)
    batch = p.get("batch_tensors", 0)
    text = (f"{p['h2d_per_step']:g} host-to-device copies per step"
            + (f", {batch} of them the batch's" if batch else " with the batch already on the device (replay)"))
    if extra >= 1:
        return Finding(name, "mistake", "problem", text, fix="create constants on the device once "
                       "(torch.tensor(..., device=device) outside the loop, or a registered buffer)")
    return Finding(name, "mistake", "fine", text)


def zero_grad_lines(calls: list[dict[str, Any]]) -> str:
    return "; ".join(f"{c['call']} with set_to_none={c['set_to_none']} ({c['calls']} call(s)) at {c['where']}"
                     for c in calls[:3])


def zero_grad(obs: Observations) -> Finding:
    """Read from the gradients themselves as gradients arrive between two steps (whatever the order of
    zero_grad, forward and backward in the loop); the zero_grad calls seen name the line."""
    name = "zero_grad without set_to_none"
    calls = obs.zero_grad_calls
    kept = [c for c in calls if not c["set_to_none"]]
    flag = "--set-to-none" if obs.recipe_flags else "optimizer.zero_grad(set_to_none=True) (torch's default)"
    if "carried" in obs.grads:
        why = (f"zero_grad is called ({zero_grad_lines(calls)}) but not between every optimizer step and the next "
               "backward, so those steps add to the last one's gradients" if calls else
               "zero_grad() is never called, so every step adds to the last one's gradients")
        return Finding(name, "mistake", "problem", "gradients still held the previous step's values when the next "
                       f"step's gradients arrived: {why}",
                       fix="call optimizer.zero_grad() once per step, anywhere between step() and the next backward()")
    per_step = sum(c["calls"] for c in kept) / max(1, obs.steps_run)
    if "zeroed" in obs.grads or (not obs.grads and per_step >= 0.5):
        cost = obs.zero_grad_s
        text = ("gradients are zeroed in place every step (a memset of every gradient, and their memory kept "
                "between steps)" + (f": {zero_grad_lines(kept)}" if kept else
                                    " by something other than zero_grad (p.grad.zero_(), say)"))
        share = cost / obs.step_s if cost and obs.step_s else None
        if cost is not None:
            text += f"; the memset measured {ms(cost)}"
        if share is not None and share < MATERIAL_SHARE:
            return Finding(name, "mistake", "measured", text + f", {pct(share)} of the step: below the "
                           f"{pct(MATERIAL_SHARE)} a change pays for here (set_to_none would also free the gradients' "
                           "memory between steps)", cost, share, flag)
        return Finding(name, "mistake", "problem", text, cost, share, flag)
    if obs.grads:
        return Finding(name, "mistake", "fine", "gradients are freed between steps (set_to_none)"
                       + (f": {zero_grad_lines(calls)}" if calls else ""))
    if calls and not kept:
        return Finding(name, "mistake", "fine", f"zero_grad frees the gradients: {zero_grad_lines(calls)}")
    return Finding(name, "mistake", NOT_HERE, "no backward followed an optimizer step while watched, and no "
                   "zero_grad call was seen")


def data_parallel(obs: Observations) -> Finding:
    name = "DataParallel where DDP would serve"
    if obs.data_parallel:
        return Finding(name, "mistake", "problem", "the model is an nn.DataParallel: one process drives every GPU, "
                       "replicates the model each step and gathers outputs on the first GPU",
                       fix="torchrun --nproc-per-node N with --strategy ddp (one process per GPU)")
    return Finding(name, "mistake", "fine", "no nn.DataParallel in the model")


def distinct_shapes(shapes: list[list]) -> int:
    return len({repr(s) for s in shapes})


def cudnn_shapes(obs: Observations) -> Finding:
    name = "cudnn.benchmark with changing input shapes"
    n = distinct_shapes(obs.shapes)
    text = f"{n} distinct input shape(s) over {len(obs.shapes)} training forwards"
    if not obs.cuda:
        return Finding(name, "mistake", NOT_HERE, f"cudnn.benchmark acts on CUDA only ({text})")
    if obs.cudnn_benchmark and n > VARYING_SHAPES:
        return Finding(name, "mistake", "problem", text + " with cudnn.benchmark on: every new shape is autotuned "
                       "again", fix="--no-cudnn-benchmark, or fixed shapes (drop_last=True, padding to buckets)")
    return Finding(name, "mistake", "fine", text + (" (cudnn.benchmark on)" if obs.cudnn_benchmark else
                                                      " (cudnn.benchmark off)"))
