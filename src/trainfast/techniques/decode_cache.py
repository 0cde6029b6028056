"""decode_cache: an image folder's files decoded once to a uint8 cache on disk, then read as pixels (the cache
itself is data/decoded_cache.py). It takes the decode off every epoch after the first; it acts only where the
data is decoded per sample (an image folder), which the task judges (tasks/effects.py)."""
from __future__ import annotations

from .switch import EVERY_ADAPTER, RungSpec, Switch


def build_cache(split, recipe) -> None:
    """The cache built (or found) once, before the runs that read it: each run then opens it."""
    from ..data.decoded_cache import with_decode_cache

    with_decode_cache(split, recipe)


SWITCHES = (
    Switch(("decode_cache",),
           rungs=(RungSpec("decode_cache", {"decode_cache": True}, place=41, tune=2, tune_inputs=2,
                           held_note=(2, "the decode cache (--decode-cache)")),),
           data="image_folder",
           # A choice a user makes for any data, which does nothing where the data is already in memory
           data_idle="acts on image folders only; this data is already in memory",
           prepare=build_cache,
           unreachable={EVERY_ADAPTER: "trainfast's decode cache works on its image-folder loader; the script's "
                                       "loader is the framework's"}),
)
