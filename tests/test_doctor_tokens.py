"""The doctor on a loop fed token ids: the padding share of its batches and packing's saving, measured on the
loop's own model and one of its batches; the compute check in tokens; and `doctor -- python examples/hf_causal_lm.py`
(slow) naming the share, the saving and the switch."""
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from torch import nn

from trainfast.checks import run_checks
from trainfast.doctor import observe_loop

pytest.importorskip("transformers")
VOCAB, PAD, EOS, MAX = 96, 0, 1, 48
ROOT = Path(__file__).resolve().parent.parent
PADDING = "padding in the batches"
SHORT = [MAX] + [2] * 31        # a batch of short documents beside a long one: packing's clearest case


def padded_batches(lengths: list[int], batches: int, seed: int = 0):
    """Batches as DataCollatorForLanguageModeling makes them: padded on the right to the longest document, the
    attention mask 0 and the label -100 there."""
    g = torch.Generator().manual_seed(seed)
    for _ in range(batches):
        longest = max(lengths)
        ids = torch.full((len(lengths), longest), PAD)
        mask = torch.zeros_like(ids)
        for row, n in enumerate(lengths):
            ids[row, :n] = torch.randint(2, VOCAB, (n,), generator=g)
            mask[row, :n] = 1
        yield {"input_ids": ids, "attention_mask": mask, "labels": ids.masked_fill(mask == 0, -100)}


def lm_loop(model, lengths: list[int], steps: int = 12):
    def loop():
        optimizer = torch.optim.SGD(model.parameters(), lr=1e-3)
        for batch in padded_batches(lengths, steps):
            optimizer.zero_grad()
            model(**batch).loss.backward()
            optimizer.step()
    return loop


def observe(model, lengths):
    obs = observe_loop(lm_loop(model, lengths), steps=4, sync_steps=2, eval_within=0)
    return obs, {f.name: f for f in run_checks(obs)}


def llama():
    """A Llama of two layers 32 wide: a step in milliseconds, the doctor's replays with it."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    return LlamaForCausalLM(LlamaConfig(vocab_size=VOCAB, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                        num_attention_heads=2, max_position_embeddings=MAX, use_cache=False,
                                        pad_token_id=PAD, eos_token_id=EOS, attn_implementation="eager"))


@pytest.fixture
def no_attention(monkeypatch):
    """The backends' timing (sdpa's masked path takes a second a step on 2 shared cores here) is the built-in run's
    test's (test_lm.py), and the matmul peak (a second of benchmark) the compute check's; these read the padding."""
    import trainfast.doctor.peaks
    import trainfast.doctor.text

    monkeypatch.setattr(trainfast.doctor.text, "observe_attention", lambda *args: {"in_use": None})
    monkeypatch.setattr(trainfast.doctor.peaks, "measure_ceiling", lambda *args, **kwargs: 1e12)


def test_a_token_loops_padding_is_measured_and_packing_named_and_nothing_on_full_batches(no_attention):
    """31 documents of 2 tokens beside one of 48 a batch: 93% padding, which packing into rows of 48 removes (three
    rows instead of 32), measured on the loop's model; full batches give no padding finding. Either way the
    compute check is made in tokens."""
    obs, found = observe(llama(), SHORT)
    padding = obs.text["padding"]
    assert padding["share"] == pytest.approx(1 - (MAX + 62) / (32 * MAX))
    assert padding["packed_s"] < padding["padded_s"]
    finding = found[PADDING]
    assert finding.status == "problem" and "93% of the positions" in finding.evidence and finding.cost_s > 0
    assert "trainfast ablate --switches padding_free,group_by_length -- COMMAND" in finding.fix
    assert obs.sample_unit == "tokens" and set(obs.samples) == {MAX + 62 - 32}     # the labels' predicted tokens
    assert "tokens/s x" in found["compute throughput vs matmul peak"].evidence

    obs, found = observe(llama(), [MAX] * 16)
    assert obs.text["padding"]["share"] == 0 and PADDING not in found


class NoPositions(nn.Module):
    """A language model whose forward takes no position_ids: packed rows would attend across documents."""

    def __init__(self):
        super().__init__()
        self.embed, self.head = nn.Embedding(VOCAB, 16), nn.Linear(16, VOCAB)

    def forward(self, input_ids, attention_mask=None, labels=None):
        logits = self.head(self.embed(input_ids))
        loss = nn.functional.cross_entropy(logits[:, :-1].flatten(0, 1), labels[:, 1:].flatten(), ignore_index=-100)
        return type("Output", (), {"loss": loss})()


def test_a_model_without_position_ids_gets_the_share_and_why_packing_cannot_act(no_attention):
    obs, found = observe(NoPositions(), SHORT)
    finding = found[PADDING]
    assert finding.status == "measured" and "93% of the positions" in finding.evidence
    assert "packing cannot act on them: the model's forward takes no position_ids" in finding.evidence
    assert "packed_s" not in obs.text["padding"]


@pytest.mark.slow
def test_doctor_on_a_trainer_script_names_the_padding_packings_saving_and_the_switch(tmp_path):
    """1 + 4 watched and 4 timed steps of 16 (256 documents, batch 16), the script's documents as it cuts them
    (256 tokens: about half of the positions are padding)."""
    command = [sys.executable, str(ROOT / "examples" / "hf_causal_lm.py"), "--documents", "256", "--out",
               str(tmp_path / "run")]
    done = subprocess.run([sys.executable, "-m", "trainfast", "doctor", "--out", str(tmp_path / "doctor"),
                           "--eval-within", "0", "--steps", "4", "--log-every", "4", "--", *command],
                          capture_output=True, text=True, timeout=900,
                          env={**os.environ, "PYTHONPATH": str(ROOT / "src")})
    assert done.returncode == 0, done.stdout + done.stderr
    out = " ".join(done.stdout.split())          # the table wraps its lines at the terminal's width
    assert "of the positions the model computes are padding" in out, out
    assert "the same documents packed without padding took" in out, out
    findings = json.loads((tmp_path / "doctor" / "doctor.json").read_text())
    padding = next(f for f in findings["findings"] if f["name"] == PADDING)
    # The switch is named where the replay measured packing saving 5% of the step; on 2 shared cores the replay of
    # this script's batch has measured no saving (34% padding over the batches watched), and then says so.
    if padding["status"] == "problem":
        assert "trainfast ablate --switches padding_free,group_by_length --" in padding["fix"], padding
        assert "hf_causal_lm.py" in padding["fix"], padding
    else:
        assert "below the share that makes packing pay here" in padding["evidence"], padding
    assert "tokens/s x" in out, out
