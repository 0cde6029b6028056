"""trainfast: PyTorch training where every speed technique is one switch, measured on your setup."""
from .recipe import Recipe, RecipeError, preset
from .session import Session
from .trainer import TrainResult, train
from .ablate import ablate  # noqa: E402  (after the submodule import, so the name is the function)

__all__ = ["Recipe", "RecipeError", "preset", "Session", "train", "TrainResult", "ablate"]
__version__ = "0.1.0"

