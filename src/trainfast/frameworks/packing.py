"""A framework script's language-model batches: the proof of the padding switches at the end of a run (the packing
collator itself is text/packing.py's, shared with a Session's loader)."""
from __future__ import annotations

from typing import Any

from ..text.packing import PackingCollator


def prove_packing(record, collator: PackingCollator | None, fields: dict[str, Any]) -> None:
    """The padding switches' proof at the end of a run: packed batches made (padding_free), and why neither can
    act on a script whose batches hold no padding (recorded in every run, the baseline's first)."""
    if collator is None:
        return
    record.unsupported.update(collator.unsupported(fields, packing=bool(fields.get("padding_free"))))
    if collator.batches and collator.tokens == collator.slots:
        return
    if collator.batches:
        record.notes.append(f"the script's training batches are {collator.padding_share:.0%} padding "
                            f"({collator.batches} batches)")
    record.prove("data_collator packs", collator.packed > 0 and collator.packed == collator.batches)
