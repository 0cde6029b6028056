"""Datasets (built-in digits, synthetic, ImageFolder, CIFAR-10), loader building and seeding."""
from .datasets import DataError, Split
from .loading import load_data

__all__ = ["DataError", "Split", "load_data"]
