"""What a run over image files counts beside its steps, pass by pass: the unreadable files it skipped (badfiles.py)
and, where the device decodes its images (device_decode.py), the files decoded on the host instead. Only a task whose
data are image files makes these counts (Task.build_file_counts): every other run's loop and record go without
them, and without the all-reduces that sum them over ranks.

Each count is a collective (summed over every worker and rank): every rank of a run takes it at the same point,
after each pass over a split, as the loop does.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import torch

from .badfiles import skipped_last_pass
from .device_decode import host_decoded_last_pass, host_decoded_names


@dataclass
class FileCounts:
    """An image-file run's counts over every pass of both splits: its record's data section (probe/record.py)."""
    host_decode: bool = True        # its images may be decoded on the device (image folders): host decodes counted
    skipped_files: int = 0          # unreadable images, skipped
    host_decoded_files: int = 0     # device_decode: images decoded on the host instead (not JPEG, CMYK, refused)
    host_decoded_named: list[str] = field(default_factory=list)     # the first few, each with its reason

    def after_pass(self, batches: Any, device: torch.device) -> None:
        """The last pass over `batches` counted in (a collective)."""
        self.skipped_files += skipped_last_pass(batches, device)
        if self.host_decode:
            self.host_decoded_files += host_decoded_last_pass(batches, device)

    def finish(self, train: Any, val: Any, device: torch.device) -> FileCounts:
        """With the evaluation's pass over `val` counted in (a collective), and the first host-decoded files named."""
        self.after_pass(val, device)
        if self.host_decode:
            self.host_decoded_named = host_decoded_names(train) + host_decoded_names(val)
        return self

    def epoch_record(self, train: Any, val: Any, device: torch.device) -> dict[str, Any]:
        """One epoch's counts of `trainfast train`'s record (metrics.jsonl): each split's last pass (collectives)."""
        record = {"skipped_files": skipped_last_pass(train, device),
                  "val_skipped_files": skipped_last_pass(val, device)}
        if self.host_decode:
            record["host_decoded_files"] = host_decoded_last_pass(train, device) + host_decoded_last_pass(val, device)
        return record

    def to_dict(self) -> dict[str, Any]:
        record = {"skipped_files": self.skipped_files}
        if self.host_decode:
            record.update(host_decoded_files=self.host_decoded_files, host_decoded_named=self.host_decoded_named)
        return record


class NoFiles:
    """A run whose data are not image files (token ids, tensors in memory): nothing to count, no collective."""

    def after_pass(self, batches: Any, device: torch.device) -> None:
        pass

    def finish(self, train: Any, val: Any, device: torch.device) -> NoFiles:
        return self

    def epoch_record(self, train: Any, val: Any, device: torch.device) -> dict[str, Any]:
        return {}

    def to_dict(self) -> dict[str, Any]:
        return {}
