"""Offline inputs for language-model training scripts that nobody here wrote, so they can be ablated unmodified:
a tiny Llama-style model saved from a config (random weights) with a byte-level BPE tokenizer, the standard
library's documents as a JSON-lines dataset (data/train.jsonl, data/test.jsonl: one {"text": ...} a line) and as
text files (train.txt, validation.txt), and a local `accuracy` metric module for evaluate.load("accuracy"), which
would otherwise fetch it from the Hub (transformers' run_clm.py loads it).

    python benchmarks/foreign_lm.py --work /tmp/foreign_lm
    cd /tmp/foreign_lm && trainfast ablate --device cpu --measure full --repeats 2 --noise-seeds 2 \\
        --switches amp,padding_free,group_by_length,eager -- python $TRL/scripts/sft.py \\
        --model_name_or_path model --dataset_name data --output_dir out --per_device_train_batch_size 16 \\
        --num_train_epochs 1 --max_length 256 --eval_strategy epoch --report_to none --save_strategy no

    trainfast ablate ... -- python run_clm.py --model_name_or_path model --train_file train.txt \\
        --validation_file validation.txt --do_train --do_eval --block_size 128 --per_device_train_batch_size 16 \\
        --num_train_epochs 1 --output_dir out_clm --report_to none --save_strategy no --use_cpu

($TRL: the installed trl package's folder; its scripts/sft.py is TRL's own SFT example. run_clm.py: transformers'
examples/pytorch/language-modeling/run_clm.py.)"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

from trainfast.text.corpus import load_corpus  # noqa: E402
from trainfast.text.tokenizer import train_tokenizer  # noqa: E402


ACCURACY = '''"""Accuracy: the share of predictions equal to their references (what evaluate's hub metric computes)."""
import datasets
import evaluate
import numpy as np


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(description=__doc__, citation="", inputs_description="predictions, references",
                                   features=datasets.Features({"predictions": datasets.Value("int32"),
                                                               "references": datasets.Value("int32")}))

    def _compute(self, predictions, references):
        return {"accuracy": float(np.mean(np.asarray(predictions) == np.asarray(references)))}
'''


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True)
    parser.add_argument("--documents", type=int, default=640)
    cli = parser.parse_args()
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    work = Path(cli.work)
    corpus = load_corpus("stdlib")
    train = [d for d in corpus.train if d.strip()][: cli.documents]
    test = [d for d in corpus.val if d.strip()][: max(32, cli.documents // 5)]
    data = work / "data"
    data.mkdir(parents=True, exist_ok=True)
    for name, docs in (("train", train), ("test", test)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps({"text": d}) + "\n" for d in docs))
    # run_clm.py's --train_file / --validation_file: plain text (one example a line: it concatenates them anyway)
    (work / "train.txt").write_text("\n".join(train) + "\n")
    (work / "validation.txt").write_text("\n".join(test) + "\n")
    # run_clm.py calls evaluate.load("accuracy"), which reads a local folder of that name before the Hub
    (work / "accuracy").mkdir(exist_ok=True)
    (work / "accuracy" / "accuracy.py").write_text(ACCURACY)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=train_tokenizer(train, 2048), pad_token="<|pad|>",
                                        eos_token="<|endoftext|>", model_max_length=256)
    model = LlamaForCausalLM(LlamaConfig(vocab_size=len(tokenizer), hidden_size=128, intermediate_size=352,
                                         num_hidden_layers=4, num_attention_heads=4, max_position_embeddings=256,
                                         pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id,
                                         bos_token_id=tokenizer.eos_token_id))
    model.save_pretrained(work / "model")
    tokenizer.save_pretrained(work / "model")
    print(f"{work}: model/ ({sum(p.numel() for p in model.parameters()) / 1e6:.2f}M parameters), data/ "
          f"({len(train)} training and {len(test)} test documents)")


if __name__ == "__main__":
    main()
