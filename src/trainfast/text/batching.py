"""A language model's batches: documents of different lengths made into one step's tensors.

Padded (the baseline, what the usual fine-tuning collators do): each batch is as long as its longest document,
the shorter ones filled with the pad token, masked out of attention and of the loss. Padding-free (the
`padding_free` switch): the same documents, packed end to end into rows with no pad token between them, the
position ids restarting at each document so that attention stays inside it (transformers builds the
block-diagonal mask from the position ids, for every attention backend) and the first token of each document
never predicted from the one before. With dense attention a row costs its length squared, so rows are bounded by
the batch's longest document (first fit, longest first): packing then never attends over more positions than the
padded batch did, and removes the padding's work. A backend with a variable-length path (flex's block masks,
flash's varlen kernels) skips the blocks across documents anyway, so there the whole batch is one row.

Either way the step sees the same documents and the same predicted tokens, so the loss is the padded loss (up to
the order of a sum) step for step. A batch is `(TokenBatch, labels)`; TokenBatch is the model's keyword
arguments, and says how many real tokens it holds: the rate counts those (tokens/s), never the padding."""
from __future__ import annotations

from dataclasses import dataclass

import torch
from torch.utils.data import Dataset, Sampler

from ..dataspecs import parse_text_spec

IGNORE = -100                      # the label of a position no loss is taken on (torch's and transformers' default)


class TokenDocs(Dataset):
    """Documents as token ids, each cut to `max_length` tokens, held as one flat tensor and the documents' offsets
    (two tensors whatever the number of documents: a run's process receives them through shared memory, and a
    loader worker's copy is two handles, not one per document)."""

    def __init__(self, documents: list[torch.Tensor], max_length: int) -> None:
        self.max_length = max_length
        self.lengths = [min(len(d), max_length) for d in documents]
        self.ids = torch.cat([d[:n] for d, n in zip(documents, self.lengths)]) if documents else torch.zeros(0)
        self.offsets = torch.tensor([0, *self.lengths]).cumsum(0)

    def __len__(self) -> int:
        return len(self.lengths)

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.ids[self.offsets[index]: self.offsets[index + 1]].long()


class TokenBatch(dict):
    """The model's keyword arguments for one batch (input_ids and attention_mask, or input_ids and position_ids
    when packed). `rate_count`: the real tokens in it (what the step clock counts), `documents`: how many, `slots`:
    the positions computed (rows x length: real tokens plus padding)."""
    rate_count: int = 0
    documents: int = 0
    slots: int = 0

    @property
    def padding_share(self) -> float:
        return 1 - self.rate_count / self.slots if self.slots else 0.0


def token_batch(tensors: dict, tokens: int, documents: int, slots: int) -> TokenBatch:
    batch = TokenBatch(tensors)
    batch.rate_count, batch.documents, batch.slots = tokens, documents, slots
    return batch


@dataclass(frozen=True)
class PadCollate:
    """Documents padded to the batch's longest, on the right: attention_mask 0 and label IGNORE there. `multiple`
    (pad_to_multiple, transformers' pad_to_multiple_of): the length rounded up to a multiple of it, so a compiled
    model sees a few lengths, not one per batch (each new length can recompile it); 0 leaves it the longest's."""
    pad_id: int
    multiple: int = 0

    def __call__(self, docs: list[torch.Tensor]):
        longest = max(len(d) for d in docs)
        if self.multiple > 1:
            longest = -(-longest // self.multiple) * self.multiple
        ids = torch.full((len(docs), longest), self.pad_id, dtype=torch.long)
        mask = torch.zeros((len(docs), longest), dtype=torch.long)
        for row, doc in enumerate(docs):
            ids[row, : len(doc)] = doc
            mask[row, : len(doc)] = 1
        labels = ids.masked_fill(mask == 0, IGNORE)
        tokens = sum(len(d) for d in docs)
        return token_batch({"input_ids": ids, "attention_mask": mask}, tokens, len(docs), ids.numel()), labels


def pack_rows(lengths: list[int], limit: int) -> list[list[int]]:
    """Document indices grouped into rows of at most `limit` tokens: first fit, longest first (each document goes
    to the first row it fits in); a document longer than the limit gets a row of its own."""
    rows: list[list[int]] = []
    room: list[int] = []
    for index in sorted(range(len(lengths)), key=lambda i: -lengths[i]):
        size = lengths[index]
        for r, left in enumerate(room):
            if size <= left:
                rows[r].append(index)
                room[r] -= size
                break
        else:
            rows.append([index])
            room.append(limit - size)
    return rows


@dataclass(frozen=True)
class PackCollate:
    """The batch's documents packed into rows without padding between them: position ids restart at each document
    (transformers' packed-sequence attention keeps each token inside its own), and each document's first token is
    labelled IGNORE, so no token is predicted across documents. `one_row`: the whole batch in one row (attention
    with a variable-length path); otherwise rows are bounded by the batch's longest document. Rows shorter than
    the longest are filled at their end with pad tokens that form a sequence of their own (positions from 0,
    label IGNORE): after every real token, so no real token attends to them."""
    pad_id: int
    one_row: bool = False

    def __call__(self, docs: list[torch.Tensor]):
        return pack(docs, docs, self.pad_id, self.one_row)


def pack(docs: list[torch.Tensor], targets: list[torch.Tensor], pad_id: int, one_row: bool = False):
    """PackCollate's packing of documents `docs` whose labels are `targets` (the same tokens for plain language
    modelling; a fine-tuning script's labels may ignore a prompt): (TokenBatch, labels). Each document's first
    label is IGNORE, so nothing is predicted across a document boundary."""
    lengths = [len(d) for d in docs]
    tokens = sum(lengths)
    rows = [list(range(len(docs)))] if one_row else pack_rows(lengths, max(lengths))
    width = max(sum(lengths[i] for i in row) for row in rows)
    ids = torch.full((len(rows), width), pad_id, dtype=torch.long)
    positions = torch.zeros((len(rows), width), dtype=torch.long)
    labels = torch.full((len(rows), width), IGNORE, dtype=torch.long)
    for r, row in enumerate(rows):
        at = 0
        for i in row:
            n = lengths[i]
            ids[r, at: at + n] = docs[i]
            positions[r, at: at + n] = torch.arange(n)
            labels[r, at + 1: at + n] = targets[i][1:]
            at += n
        positions[r, at:] = torch.arange(width - at)
    return token_batch({"input_ids": ids, "position_ids": positions}, tokens, len(docs), ids.numel()), labels


def length_sampler(lengths: list[int], batch_size: int, seed: int, generator, dist):
    """group_by_length: batches of `batch_size` drawn from documents of similar `lengths`, transformers' own
    samplers (shuffled mega-batches of 50 batches, each sorted by length, as the Trainer's `group_by_length` does),
    the order drawn from `generator`; under torchrun each rank its share, reshuffled every epoch (seed + epoch).
    The built-in run's loader, a Session's adopted loader and a framework script's training loader all take it;
    without transformers, the same order from LengthGroupedSampler below (one process)."""
    try:
        from transformers.trainer_pt_utils import DistributedLengthGroupedSampler, LengthGroupedSampler
    except ImportError:
        if dist is not None and dist.enabled:
            raise
        return LengthGroupedSampler(batch_size, lengths, generator)
    if dist is not None and dist.enabled:
        sampler = DistributedLengthGroupedSampler(batch_size, num_replicas=dist.world_size, rank=dist.rank,
                                                  seed=seed, drop_last=True, lengths=lengths)
        dist.samplers.append(sampler)
        return sampler
    return LengthGroupedSampler(batch_size, lengths=lengths, generator=generator)


class LengthGroupedSampler(Sampler):
    """transformers' LengthGroupedSampler, for a script without transformers: a random permutation cut into
    mega-batches of (up to) 50 batches, each sorted by length, longest first, and the mega-batch holding the
    longest document put first (a run that will run out of memory does so on its first step)."""

    def __init__(self, batch_size: int, lengths: list[int], generator=None) -> None:
        self.batch_size, self.lengths, self.generator = batch_size, list(lengths), generator

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self):
        order = torch.randperm(len(self.lengths), generator=self.generator).tolist()
        size = max(1, min(len(order) // (self.batch_size * 4), 50)) * self.batch_size
        groups = [sorted(order[i: i + size], key=lambda j: -self.lengths[j]) for i in range(0, len(order), size)]
        longest = max(range(len(groups)), key=lambda g: self.lengths[groups[g][0]]) if groups else 0
        if groups:
            groups[0][0], groups[longest][0] = groups[longest][0], groups[0][0]
        return iter([index for group in groups for index in group])


@dataclass
class TextSplit:
    """A language-model dataset, as the tasks take a split: training and validation documents as token ids, cut to
    `max_length`, and what the model needs from the tokenizer."""
    train: TokenDocs
    val: TokenDocs
    vocab_size: int
    pad_id: int
    eos_id: int
    name: str
    max_length: int
    tokenizer_path: str = ""
    image_size: None = None          # what the image tasks' splits carry, so generic code reads them alike
    num_classes: int = 0

    def padding_share(self, batch_size: int) -> float:
        """The share of the positions a padded batch of `batch_size` training documents computes that are padding,
        over the epoch in the loader's order-independent expectation (consecutive documents as batches)."""
        lengths = self.train.lengths
        slots = tokens = 0
        for start in range(0, len(lengths) - batch_size + 1, batch_size):
            chunk = lengths[start: start + batch_size]
            slots += max(chunk) * len(chunk)
            tokens += sum(chunk)
        return 1 - tokens / slots if slots else 0.0


DEFAULT_SEQ_LEN = 256               # tokens a document is cut to on the CPU (the GPU script passes its own)
VAL_PER_TRAIN = 4                   # a subset keeps one validation document for every 4 training ones


def sample(documents: list, count: int | None) -> list:
    """`count` documents drawn once with a fixed seed (the same ones on every run and machine), in their order."""
    if count is None or count >= len(documents):
        return documents
    keep = sorted(torch.randperm(len(documents), generator=torch.Generator().manual_seed(0))[:count].tolist())
    return [documents[i] for i in keep]


def load_text(spec: str, max_length: int = DEFAULT_SEQ_LEN) -> TextSplit:
    """`stdlib`, `stdlib:N` or `text:PATH` as token ids (text/corpus.py, text/tokenizer.py). The tokenizer is
    trained on the whole corpus's training split either way, so a sample shares the full corpus's tokens."""
    from .corpus import load_corpus
    from .tokenizer import encoded_corpus

    source, count = parse_text_spec(spec)
    corpus = load_corpus(source)
    encoded = encoded_corpus(corpus)
    train = sample(encoded.train, count)
    val = sample(encoded.val, None if count is None else max(32, count // VAL_PER_TRAIN))
    name = corpus.name if count is None else f"{corpus.name}, {len(train)} of {len(encoded.train)} documents"
    return TextSplit(TokenDocs(train, max_length), TokenDocs(val, max_length), encoded.vocab_size, encoded.pad_id,
                     encoded.eos_id, name, max_length, encoded.tokenizer_path)
