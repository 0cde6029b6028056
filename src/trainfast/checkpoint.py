"""Checkpoints: atomic saves, a checksum, safe loads, and the full state for a bit-exact resume.

Writing: a temp file in the same folder, fsync, os.replace over the target, fsync the folder, so a
reader (or a restarted run) only ever sees complete files. Old checkpoints are pruned only after the
new one is complete. A kill mid-write leaves a `.*.tmp` file, which the next run deletes.

File layout: a 60-byte header (magic, format version, payload length, sha256 of the payload), then the
payload exactly as torch.save writes it. The hash catches a flipped byte or a truncated copy: loading
falls back to the previous good checkpoint and says so. The hash is no defence against a crafted file
(anyone can compute it): that is weights_only's job. Every load uses torch.load(weights_only=True), and a
file that needs more than tensors and plain containers is refused with the name of what it asked for.
There is no fallback to weights_only=False.

A checkpoint holds: model, optimizer, scheduler, precision (GradScaler) state, the non-finite policy's
counters, step, epoch, position inside the epoch and the epoch's metrics so far, the recipe, and per
rank the RNG states of python, numpy, torch (CPU and CUDA) and of the data order (data/sampler.py).
"""
from __future__ import annotations

import hashlib
import io
import os
import pickle
import random
import re
import shutil
import struct
import sys
import tempfile
import time
from pathlib import Path
from typing import Any, BinaryIO, Callable

import numpy as np
import torch

from .techniques import resumable_fields
from .techniques.background_save import checkpoint_writer

FORMAT_VERSION = 1
MAGIC = b"TRAINFAST-CKPT\x00\x01"                 # 16 bytes
HEADER = struct.Struct("<16sIQ32s")               # magic, format version, payload bytes, sha256 of payload
SUFFIX = ".ckpt"
# Recipe fields that may change between a run and its resume without changing the trajectory, as each switch
# declares (techniques/: Switch.resumable; the non-finite policy only acts on a NaN/inf, so a run stopped by one
# may be resumed with nonfinite=skip).
RESUMABLE_CHANGES = resumable_fields()


class CheckpointError(RuntimeError):
    """A checkpoint that cannot be used; the message names the file."""


class CorruptCheckpoint(CheckpointError):
    """Truncated, bad header or checksum mismatch: a resume falls back to the previous checkpoint."""


class WriteError(OSError):
    """A file could not be written whole (a full disk, a quota, a read-only folder): the message names the file,
    the system's reason and the free space there; the partial file is gone and the file it would have replaced
    (a previous checkpoint, results.json) is untouched."""


class UnsafeCheckpoint(CheckpointError):
    """The file needs more than tensors and plain containers to load: refused, never retried unsafely."""


def log_stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


# --- atomic files ----------------------------------------------------------------------------------

def atomic_write(path: str | Path, write: Callable[[BinaryIO], None]) -> None:
    """Run `write(f)` on a temp file next to `path`, fsync it, os.replace it over `path`, fsync the folder.
    Costs one fsync of the file and one of the folder per save (milliseconds on local disks)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    try:
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise write_error(path, exc) from exc
    try:
        with os.fdopen(fd, "wb") as f:
            write(f)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    except BaseException as exc:
        Path(tmp).unlink(missing_ok=True)
        cause = system_error(exc)
        if cause is None or isinstance(exc, WriteError):
            raise
        raise write_error(path, cause) from exc
    fsync_folder(path.parent)


def system_error(exc: BaseException) -> OSError | None:
    """The OSError behind a failed write, if there is one: torch.save's zip writer reports a full disk as a
    RuntimeError ("unexpected pos ...") raised while handling the OSError our file object raised."""
    seen = 0
    while exc is not None and seen < 8:
        if isinstance(exc, OSError) and exc.errno is not None:
            return exc
        exc, seen = exc.__cause__ or exc.__context__, seen + 1
    return None


def write_error(path: Path, cause: OSError) -> WriteError:
    try:
        free = f"; {shutil.disk_usage(path.parent).free / 2**20:,.0f} MiB free there"
    except OSError:
        free = ""
    return WriteError(cause.errno, f"{path}: could not be written: {cause.strerror or cause}{free}. The partial file "
                                   "was removed; the file it would have replaced, if any, is unchanged")


def atomic_write_text(path: str | Path, text: str) -> None:
    """A text file (JSON, YAML) written as atomic_write writes: whole or not at all."""
    atomic_write(path, lambda f: f.write(text.encode()))


def fsync_folder(folder: Path) -> None:
    dir_fd = os.open(folder, os.O_RDONLY)
    try:
        os.fsync(dir_fd)
    finally:
        os.close(dir_fd)


def atomic_save(obj: Any, path: str | Path) -> None:
    atomic_write(path, lambda f: torch.save(obj, f))


def safe_load(path: str | Path, map_location: str | torch.device = "cpu") -> Any:
    """Tensors and plain containers only: a file that needs arbitrary unpickling is refused, never retried
    without weights_only."""
    with open(path, "rb") as f:
        return _load_weights_only(f, path, map_location)


def _load_weights_only(f: BinaryIO, path: str | Path, map_location) -> Any:
    try:
        return torch.load(f, map_location=map_location, weights_only=True)
    except pickle.UnpicklingError as exc:
        found = re.search(r"GLOBAL (\S+)", str(exc))
        what = f"it asks for the python object {found.group(1)}" if found else str(exc).splitlines()[0]
        raise UnsafeCheckpoint(
            f"{path}: refused to load: {what}, and only tensors and plain containers are allowed. trainfast loads "
            f"with torch.load(weights_only=True) only and never falls back to full unpickling, which can run "
            f"code. Inspect the file's origin; do not load it if you do not trust it.") from None


# --- the checksummed container ---------------------------------------------------------------------

class _HashingWriter:
    """Passes writes through to `f` and hashes them: the checksum costs no second pass over the data."""

    def __init__(self, f: BinaryIO) -> None:
        self.f, self.sha, self.size = f, hashlib.sha256(), 0

    def write(self, data) -> int:
        self.sha.update(data)
        self.size += len(data)
        return self.f.write(data)

    def flush(self) -> None:
        self.f.flush()


class _Window(io.RawIOBase):
    """A read-only view of bytes [start, start + size) of `f`, so torch.load reads the payload in place
    instead of from a copy in memory."""

    def __init__(self, f: BinaryIO, start: int, size: int) -> None:
        super().__init__()
        self.f, self.start, self.size, self.pos = f, start, size, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self.pos

    def seek(self, offset: int, whence: int = io.SEEK_SET) -> int:
        base = {io.SEEK_SET: 0, io.SEEK_CUR: self.pos, io.SEEK_END: self.size}[whence]
        self.pos = max(0, base + offset)
        return self.pos

    def readinto(self, buffer) -> int:
        n = max(0, min(len(buffer), self.size - self.pos))
        self.f.seek(self.start + self.pos)
        got = self.f.readinto(memoryview(buffer)[:n])
        self.pos += got
        return got


def write_checkpoint(payload: dict[str, Any], path: str | Path) -> None:
    def write(f: BinaryIO) -> None:
        f.write(bytes(HEADER.size))                      # placeholder, filled in once the hash is known
        hashing = _HashingWriter(f)
        torch.save(payload, hashing)
        f.seek(0)
        f.write(HEADER.pack(MAGIC, FORMAT_VERSION, hashing.size, hashing.sha.digest()))

    atomic_write(path, write)


def read_checkpoint(path: str | Path) -> dict[str, Any]:
    """Verify header, length and sha256 (one read pass), then torch.load(weights_only=True) the payload."""
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(HEADER.size)
        if len(head) < HEADER.size:
            raise CorruptCheckpoint(f"{path}: truncated ({len(head)} bytes, shorter than the header)")
        magic, version, size, digest = HEADER.unpack(head)
        if magic != MAGIC:
            raise CorruptCheckpoint(f"{path}: not a trainfast checkpoint (bad header)")
        if version > FORMAT_VERSION:
            raise CheckpointError(f"{path}: format version {version} is newer than this trainfast reads "
                                  f"({FORMAT_VERSION}); upgrade trainfast")
        actual = os.fstat(f.fileno()).st_size - HEADER.size
        if actual != size:
            raise CorruptCheckpoint(f"{path}: payload is {actual} bytes, header says {size} (truncated or appended)")
        sha = hashlib.sha256()
        for chunk in iter(lambda: f.read(1 << 20), b""):
            sha.update(chunk)
        if sha.digest() != digest:
            raise CorruptCheckpoint(f"{path}: checksum mismatch (sha256), the file is corrupt")
        payload = _load_weights_only(io.BufferedReader(_Window(f, HEADER.size, size)), path, "cpu")
    if not isinstance(payload, dict) or "step" not in payload:
        raise CorruptCheckpoint(f"{path}: checksum is valid but the payload is not a trainfast checkpoint")
    return payload


# --- the folder of checkpoints ----------------------------------------------------------------------

def checkpoint_path(folder: Path, step: int) -> Path:
    return folder / f"step-{step:09d}{SUFFIX}"


def list_checkpoints(folder: str | Path) -> list[Path]:
    """Complete checkpoints, newest first (temp files start with '.' and end in .tmp: never listed)."""
    folder = Path(folder)
    if not folder.is_dir():
        return []
    return sorted((p for p in folder.glob(f"step-*{SUFFIX}") if not p.name.startswith(".")), reverse=True)


def remove_partials(folder: str | Path) -> list[Path]:
    """Delete temp files left by a writer killed mid-save. Call before this run writes anything: only
    one process (rank 0 of one run) writes into a checkpoint folder."""
    folder = Path(folder)
    removed = sorted(folder.glob(f".*{SUFFIX}.*.tmp")) if folder.is_dir() else []
    for p in removed:
        p.unlink(missing_ok=True)
    return removed


def load_newest(folder: str | Path, log: Callable[[str], None] = log_stderr) -> tuple[Path, dict[str, Any]] | None:
    """The newest checkpoint that passes its checksum; corrupt ones are reported and skipped. An unsafe
    file (one that asks to run code) is not skipped: it stops the run, since someone tampered with it."""
    for path in list_checkpoints(folder):
        try:
            return path, read_checkpoint(path)
        except CorruptCheckpoint as exc:
            log(f"checkpoint: {exc}; trying the previous one")
    return None


def prune(folder: Path, keep: int) -> None:
    for old in list_checkpoints(folder)[keep:]:
        old.unlink(missing_ok=True)


# --- RNG state as plain types (weights_only-loadable) ----------------------------------------------

def capture_rng() -> dict[str, Any]:
    kind, key, pos, has_gauss, gauss = np.random.get_state()
    return {
        "python": random.getstate(),
        "numpy": {"kind": kind, "key": torch.from_numpy(key.astype(np.int64)), "pos": int(pos),
                  "has_gauss": int(has_gauss), "gauss": float(gauss)},
        "torch": torch.get_rng_state(),
        "cuda": torch.cuda.get_rng_state_all() if torch.cuda.is_available() else [],
    }


def restore_rng(rng: dict[str, Any]) -> None:
    version, internal, gauss = rng["python"]
    random.setstate((version, tuple(internal), gauss))
    n = rng["numpy"]
    np.random.set_state((n["kind"], n["key"].numpy().astype(np.uint32), n["pos"], n["has_gauss"], n["gauss"]))
    torch.set_rng_state(rng["torch"])
    if rng["cuda"] and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(rng["cuda"])


# --- the training state (the built-in loop's checkpoints and Session.save share it) -----------------

def capture_state(state) -> dict[str, Any]:
    """Everything of a session.TrainState that a resume needs, as tensors and plain types. The model is the
    eager module's state_dict: no `module.` (DDP) or `_orig_mod.` (torch.compile) prefixes."""
    return {
        "step": state.step, "micro_step": state.micro_step, "epoch": state.epoch,
        "model": state.model.state_dict(),
        "optimizer": state.optimizer.state_dict(),
        "scheduler": state.scheduler.state_dict(),
        "precision": state.precision.state_dict(),     # loss scaler, skip counts, O2's fp32 masters
        "nonfinite": state.nonfinite.state_dict(),
    }


def restore_state(state, payload: dict[str, Any]) -> None:
    state.model.load_state_dict(payload["model"])
    state.optimizer.load_state_dict(payload["optimizer"])
    state.scheduler.load_state_dict(payload["scheduler"])
    state.precision.load_state_dict(payload["precision"])
    state.nonfinite.load_state_dict(payload["nonfinite"])
    state.step, state.epoch = payload["step"], payload["epoch"]
    state.micro_step = payload.get("micro_step", payload["step"])


# --- the cadence object the trainer hands to the engine --------------------------------------------

def _gather_single(obj: Any) -> list[Any]:
    return [obj]


class Checkpointer:
    """Saves the full training state every `save_every` steps (0: only at epoch ends) and at the end of
    every epoch into `folder`, keeping the newest `keep`. Only rank 0 writes; every rank contributes its
    RNG and data-order state through `gather` (an all-gather under torchrun, identity otherwise).

    Each save first reads the Meter (one sync, which a save needs anyway to copy the state): under
    nonfinite=stop a non-finite loss raises there, so no checkpoint ever holds a diverged step."""

    def __init__(self, folder: str | Path, recipe, data_order, rank: int = 0,
                 gather: Callable[[Any], list[Any]] = _gather_single, log: Callable[[str], None] = log_stderr) -> None:
        self.folder = Path(folder)
        self.recipe = recipe
        self.data_order = data_order          # data/sampler.py ResumableBatchSampler of the train loader
        self.rank = rank
        self.gather = gather
        self.log = log
        self.meter = None
        self.epoch_first_step = 0
        self._resumed_stats: dict[str, Any] | None = None
        self.last_saved: Path | None = None
        self.writer = checkpoint_writer(recipe)      # in the loop, or in a background thread (async_checkpoint)
        self.saves = 0
        self.loop_seconds = 0.0       # what the saves cost the loop: all of a save, or its copy (async_checkpoint)

    # called by the trainer -----------------------------------------------------------------------
    def begin_epoch(self, state, meter) -> None:
        """Point at this epoch's Meter; on a resumed epoch, give it the metrics of the steps already done."""
        self.meter = meter
        position = self.data_order.pending_skip
        self.epoch_first_step = state.micro_step - position    # positions count batches (micro-steps)
        if self._resumed_stats is not None:
            stats = self._resumed_stats
            meter.stats.losses.extend(stats["losses"])
            meter.stats.correct += stats["correct"]
            meter.stats.samples += stats["samples"]
            meter.stats.term_sums.update(stats.get("term_sums", {}))     # loss dicts: each term's sum so far
            self._resumed_stats = None

    def after_step(self, state) -> None:
        every = self.recipe.save_every
        at_update = state.accumulated == 0     # never inside an accumulation: no gradients to lose
        if every and at_update and state.step % every == 0:
            self.save(state, at_epoch_end=False)

    def end_epoch(self, state) -> None:
        self.save(state, at_epoch_end=True)    # same step as a mid-epoch save: replaces it

    def finish(self) -> None:
        """Wait for a save still being written (async_checkpoint) and raise its error, if it failed."""
        self.writer.wait()

    # the state ----------------------------------------------------------------------------------
    def save(self, state, at_epoch_end: bool) -> Path | None:
        started = time.perf_counter()
        try:
            return self._save(state, at_epoch_end)
        finally:
            self.saves += 1
            self.loop_seconds += time.perf_counter() - started

    def _save(self, state, at_epoch_end: bool) -> Path | None:
        self.meter.flush()
        position = state.micro_step - self.epoch_first_step
        stats = self.meter.stats       # this rank's metrics of the epoch so far (an epoch end starts anew)
        epoch_stats = {"losses": [] if at_epoch_end else list(stats.losses),
                       "correct": 0 if at_epoch_end else stats.correct,
                       "samples": 0 if at_epoch_end else stats.samples,
                       "term_sums": {} if at_epoch_end else dict(stats.term_sums)}
        ranks = self.gather({"rng": capture_rng(), "data": self.data_order.state_dict(at_epoch_end),
                             "epoch_stats": epoch_stats})
        if self.rank != 0:
            return None
        payload = {
            "format": "trainfast.checkpoint", "version": FORMAT_VERSION,
            **capture_state(state),
            "position": 0 if at_epoch_end else position,
            "recipe": self.recipe.to_dict(),
            "world_size": len(ranks),
            "ranks": ranks,
        }
        path = checkpoint_path(self.folder, state.step)

        def write(owned: dict[str, Any]) -> None:    # in the loop, or in the background on a copy
            write_checkpoint(owned, path)
            prune(self.folder, self.recipe.keep_checkpoints)    # only now: the new one is complete
            self.last_saved = path

        self.writer.save(payload, write)
        return path

    def start(self, state, resume: str | Path | None) -> dict[str, Any] | None:
        """Clean partial files, then (with resume) load the newest good checkpoint, or the given file,
        into `state`. Returns the loaded payload, or None when starting fresh."""
        if self.rank == 0:
            for p in remove_partials(self.folder):
                self.log(f"checkpoint: removed partial file {p.name} (a save was interrupted)")
        existing = list_checkpoints(self.folder)
        if resume is None:
            if existing:
                raise CheckpointError(f"{self.folder} holds checkpoints of an earlier run ({existing[0].name}); "
                                      f"pass --resume auto to continue it, or choose another --out")
            return None
        if resume == "auto":
            found = load_newest(self.folder, self.log)
            if found is None:
                self.log(f"checkpoint: none in {self.folder}, starting fresh")
                return None
            path, payload = found
        else:
            path, payload = Path(resume), read_checkpoint(resume)
        self.restore(state, payload, path)
        return payload

    def restore(self, state, payload: dict[str, Any], path: Path) -> None:
        check_recipe(payload["recipe"], self.recipe, path)
        ranks = payload["ranks"]
        world = len(ranks)
        mine = self.gather(None)
        if world != len(mine):
            raise CheckpointError(f"{path}: written by {world} rank(s), this run has {len(mine)}; "
                                  f"resume with the same number of processes")
        restore_state(state, payload)
        self.data_order.load_state_dict(ranks[self.rank]["data"], skip=payload["position"])
        self._resumed_stats = ranks[self.rank]["epoch_stats"] if payload["position"] else None
        restore_rng(ranks[self.rank]["rng"])     # last: nothing after this may draw random numbers
        self.log(f"checkpoint: resumed from {path.name} (step {state.step}, epoch {state.epoch + 1}, "
                 f"batch {payload['position']} of the epoch)")


class NoCheckpoints:
    """Without a run folder there is nowhere to save: every hook is a no-op."""

    last_saved = None
    saves, loop_seconds = 0, 0.0

    def start(self, state, resume) -> None:
        if resume is not None:
            raise CheckpointError(f"resume={resume!r} needs a run folder (--out DIR) holding the checkpoints")

    def begin_epoch(self, state, meter) -> None:
        pass

    def after_step(self, state) -> None:
        pass

    def end_epoch(self, state) -> None:
        pass

    def finish(self) -> None:
        pass


def build_checkpointer(out_dir: Path | None, recipe, train_batches, rank: int = 0,
                       gather: Callable[[Any], list[Any]] = _gather_single,
                       log: Callable[[str], None] = log_stderr) -> Checkpointer | NoCheckpoints:
    """Checkpoints live in the run folder, under checkpoints/. `train_batches` is what build_batches
    returned: its loader's batch sampler carries the data order."""
    if out_dir is None:
        return NoCheckpoints()
    return Checkpointer(Path(out_dir) / "checkpoints", recipe, train_batches.loader.batch_sampler, rank, gather, log)


def check_recipe(saved: dict[str, Any], recipe, path: Path) -> None:
    """A resume continues the same trajectory: refuse a recipe that changes it (names every field)."""
    current = recipe.to_dict()
    changed = sorted(k for k in set(saved) | set(current)
                     if k not in RESUMABLE_CHANGES and saved.get(k) != current.get(k))
    if changed:
        diffs = ", ".join(f"{k}: {saved.get(k)!r} -> {current.get(k)!r}" for k in changed)
        raise CheckpointError(f"{path}: the recipe differs from the checkpoint's ({diffs}); resume with the "
                              f"same recipe or start a new run folder")
