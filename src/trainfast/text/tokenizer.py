"""A byte-level BPE tokenizer (Hugging Face `tokenizers`, as GPT-2's), trained once on a corpus's training split and
cached with the token ids of every document, so every later run of the same corpus starts in a second.

Byte level, so any text encodes (no unknown token); VOCAB_SIZE 4096 keeps the embedding and output layers of the
small CPU models from dominating their compute while still making tokens of whole identifiers and keywords
(about 3.5 characters a token on the standard library's source, against 1 for raw bytes: 3.5x fewer positions to
attend over for the same text). The cache key is a hash of the documents and these settings: another corpus,
another Python version's standard library or another vocabulary size trains its own."""
from __future__ import annotations

import hashlib
import os
from dataclasses import dataclass
from pathlib import Path

import torch

from .corpus import Corpus

VOCAB_SIZE = 4096
PAD = "<|pad|>"
EOS = "<|endoftext|>"
FORMAT = 1                          # bumped when what is cached changes


@dataclass
class Encoded:
    train: list[torch.Tensor]       # one 1-D int32 tensor of token ids per document
    val: list[torch.Tensor]
    vocab_size: int
    pad_id: int
    eos_id: int
    tokenizer_path: str


def cache_dir() -> Path:
    root = os.environ.get("TRAINFAST_CACHE") or os.path.join(os.environ.get("XDG_CACHE_HOME")
                                                             or os.path.expanduser("~/.cache"), "trainfast")
    return Path(root) / "text"


def corpus_key(corpus: Corpus, vocab_size: int) -> str:
    digest = hashlib.sha256(f"{FORMAT}:{vocab_size}:".encode())
    for split in (corpus.train, corpus.val):
        digest.update(str(len(split)).encode())
        for doc in split:
            digest.update(doc.encode("utf-8", "replace"))
            digest.update(b"\0")
    return digest.hexdigest()[:16]


def train_tokenizer(documents: list[str], vocab_size: int):
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=[PAD, EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tokenizer.train_from_iterator(documents, trainer=trainer)
    return tokenizer


def encode(tokenizer, documents: list[str], eos_id: int) -> list[torch.Tensor]:
    """Each document's ids with the end-of-text token after it (what a decoder learns to stop on)."""
    return [torch.tensor(e.ids + [eos_id], dtype=torch.int32)
            for e in tokenizer.encode_batch(documents, add_special_tokens=False)]


def encoded_corpus(corpus: Corpus, vocab_size: int = VOCAB_SIZE) -> Encoded:
    """The corpus as token ids, from the cache when this corpus was encoded before (written atomically: an
    interrupted first run leaves no half file behind)."""
    from tokenizers import Tokenizer

    folder = cache_dir()
    key = corpus_key(corpus, vocab_size)
    tok_path, ids_path = folder / f"{key}.tokenizer.json", folder / f"{key}.ids.pt"
    if tok_path.is_file() and ids_path.is_file():
        saved = torch.load(ids_path, weights_only=True)
        tokenizer = Tokenizer.from_file(str(tok_path))
        return Encoded(saved["train"], saved["val"], tokenizer.get_vocab_size(), tokenizer.token_to_id(PAD),
                       tokenizer.token_to_id(EOS), str(tok_path))
    tokenizer = train_tokenizer(corpus.train, vocab_size)
    eos = tokenizer.token_to_id(EOS)
    train, val = encode(tokenizer, corpus.train, eos), encode(tokenizer, corpus.val, eos)
    folder.mkdir(parents=True, exist_ok=True)
    partial = folder / f"{key}.{os.getpid()}.partial"
    tokenizer.save(str(partial))
    os.replace(partial, tok_path)
    torch.save({"train": train, "val": val}, partial)
    os.replace(partial, ids_path)
    return Encoded(train, val, tokenizer.get_vocab_size(), tokenizer.token_to_id(PAD), eos, str(tok_path))
