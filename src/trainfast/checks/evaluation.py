"""Mistakes in the evaluation: dropout that still drops in eval mode, an autograd graph built while evaluating,
and evaluation without model.eval()."""
from __future__ import annotations

from typing import Any

from .findings import NOT_HERE, Finding, Observations, pct


def eval_dropout(obs: Observations) -> Finding:
    name = "dropout active in eval mode"
    d = obs.dropout
    if d is None:
        return Finding(name, "mistake", NOT_HERE, "no training forward with positional inputs was seen after the first "
                                                  "step: no input to test with")
    if "error" in d:
        return Finding(name, "mistake", NOT_HERE, f"the eval forwards of the last training input failed: {d['error']}")
    text = (f"in eval() + inference_mode two forwards of the same input differ by up to {d['max_diff']:.3g} "
            f"({pct(d['relative_diff'])} of the output's scale)")
    fix = ("use nn.Dropout modules (they follow eval()), or pass training=self.training to F.dropout "
           "(dropout_p=self.p if self.training else 0.0 to scaled_dot_product_attention)")
    if d["calls"]:
        return Finding(name, "mistake", "problem", text + "; still dropping: " + "; ".join(d["calls"]), fix=fix)
    if d["relative_diff"] > 1e-3 and d.get("random_calls"):
        return Finding(name, "mistake", "measured", text + ": no dropout drops; the forward draws random numbers "
                       f"({sampling(d)}), which eval() does not switch off")
    if d["relative_diff"] > 1e-3:
        return Finding(name, "mistake", "problem", text + " (no dropout or random call of torch's was seen making "
                       "them differ: a random op in an extension, or nondeterministic kernels)", fix=fix)
    return Finding(name, "mistake", "fine", "two eval forwards of the same input agree exactly")


def sampling(d: dict[str, Any]) -> str:
    """The random draws of a forward, and what they are when they are meant."""
    return ("; ".join(d["random_calls"][:3]) + ": sampling by design, as in a VAE's reparameterization or a "
            "diffusion step, is right; a hand-made dropout mask there should follow self.training")


def eval_unseen(obs: Observations) -> str:
    """Why the evaluation checks have nothing to read."""
    wait = obs.eval_wait or {}
    outcome, steps = wait.get("outcome"), wait.get("steps", 0)
    if outcome == "limit":
        return (f"no evaluation forward ran in the watched steps, nor in the {wait['limit_s']:g} s the loop was then "
                f"kept going, untimed ({steps} more step(s)): its evaluation comes later (--eval-within SECONDS waits "
                "longer)")
    if outcome == "ended":
        return f"the loop ended after {obs.steps_run + steps} step(s) without an evaluation forward"
    if outcome == "off":
        return "no evaluation forward ran in the watched steps, and waiting for one was off (--eval-within 0)"
    return "no evaluation forward (model in eval mode, or grad off) ran while watched"


def eval_source(obs: Observations) -> str:
    """Where the evaluation the checks read came from, when the loop was kept going for it."""
    wait = obs.eval_wait or {}
    if wait.get("outcome") == "reached" or (wait.get("outcome") == "ended" and wait.get("steps")):
        return (f" (the loop's first evaluation, reached {wait['waited_s']:.0f} s and {wait['steps']} untimed step(s) "
                "after the watched steps; the run was stopped there)")
    return ""


def eval_graph(obs: Observations) -> Finding:
    name = "evaluation builds an autograd graph"
    total = obs.eval_forwards + (obs.train_mode_eval or {}).get("forwards", 0)
    if not total:
        return Finding(name, "mistake", NOT_HERE, eval_unseen(obs))
    if obs.eval_graph:
        where = ", ".join(f"{k} ({v} forward(s))" for k, v in obs.eval_graph.items())
        return Finding(name, "mistake", "problem", f"{sum(obs.eval_graph.values())} of {total} evaluation "
                       f"forwards ran in eval mode with grad enabled and returned outputs that require grad: {where}"
                       + eval_source(obs),
                       fix="wrap evaluation in `with torch.inference_mode():` (or torch.no_grad()): no graph is kept, "
                           "activations are freed at once")
    return Finding(name, "mistake", "fine", f"{total} evaluation forward(s) ran without autograd" + eval_source(obs))


# what each kind of module does differently in training mode
TRAIN_MODE_EFFECTS = (("Dropout", "dropout drops units"),
                      ("BatchNorm", "batch norm normalizes with each batch's statistics and updates its running "
                                    "ones with evaluation data"),
                      ("InstanceNorm", "instance norm updates its running statistics"),
                      ("MultiheadAttention", "attention dropout drops weights"),
                      ("RNN", "the recurrent layers' dropout drops"), ("LSTM", "the recurrent layers' dropout drops"),
                      ("GRU", "the recurrent layers' dropout drops"))


def eval_mode(obs: Observations) -> Finding:
    name = "evaluation without model.eval()"
    seen = obs.train_mode_eval
    if not seen:
        if not obs.eval_forwards:
            return Finding(name, "mistake", NOT_HERE, eval_unseen(obs))
        return Finding(name, "mistake", "fine", f"{obs.eval_forwards} evaluation forward(s) ran in eval mode"
                       + eval_source(obs))
    text = (f"{seen['forwards']} grad-free forward(s) of the trained model ran in training mode (model.eval() "
            "was not called before them)")
    fix = "call model.eval() before evaluating, and model.train() before training again"
    modules, repeat = seen.get("modules") or {}, seen.get("repeat")
    if modules:
        listed = ", ".join(f"{k} x{v}" if v > 1 else k for k, v in modules.items())
        effects = list(dict.fromkeys(e for key, e in TRAIN_MODE_EFFECTS if any(key in m for m in modules)))
        return Finding(name, "mistake", "problem", f"{text}: its {listed} act as in training"
                       + (f" ({'; '.join(effects)})" if effects else "") + eval_source(obs), fix=fix)
    if repeat and "error" in repeat:
        return Finding(name, "mistake", NOT_HERE, f"{text}; the model would not take that input again: "
                       f"{repeat['error']}")
    if repeat and not repeat["calls"] and repeat["relative_diff"] > 1e-3 and repeat.get("random_calls"):
        return Finding(name, "mistake", "fine", f"{text}, but nothing in this model acts differently in eval(): two "
                       f"such forwards differ only by random draws that do not follow the mode ({sampling(repeat)})")
    if repeat and (repeat["relative_diff"] > 1e-3 or repeat["calls"]):
        where = "; still dropping: " + "; ".join(repeat["calls"]) if repeat["calls"] else ""
        return Finding(name, "mistake", "problem", f"{text}: two such forwards of the same input differ by up to "
                       f"{repeat['max_diff']:.3g} (dropout that follows self.training){where}" + eval_source(obs),
                       fix=fix)
    return Finding(name, "mistake", "fine", f"{text}, but nothing in this model acts differently in eval() (no "
                   "dropout or batch norm module; two forwards of the same input agree): here it changes nothing")
