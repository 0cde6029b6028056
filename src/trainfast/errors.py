"""The error every data source raises on bad input, in a module of its own: image data (data/), detection data
(detection/) and text (text/) all raise it, and a user's code or the CLI catches one class whichever the source,
so it lives below all three rather than in one of them."""
from __future__ import annotations


class DataError(ValueError):
    """Bad data input; the message names the path or spec."""
