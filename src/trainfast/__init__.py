"""trainfast: PyTorch training where every speed technique is one switch, measured on your setup."""
from .recipe import Recipe, RecipeError, preset
from .trainer import TrainResult, train

__all__ = ["Recipe", "RecipeError", "preset", "train", "TrainResult", "ablate"]
__version__ = "0.1.0"


def ablate(*args, **kwargs):
    """See trainfast.ablate.run_ablation."""
    from .ablate import ablate as _ablate

    return _ablate(*args, **kwargs)
