"""Datasets (built-in digits, synthetic, ImageFolder, CIFAR-10), loader building and seeding."""
from ..errors import DataError
from .datasets import Split
from .loading import load_data

__all__ = ["DataError", "Split", "load_data"]
