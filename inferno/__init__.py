"""Inferno: single-GPU inference for the Qwen3.5-family `.ninfer` artifacts."""

__version__ = "0.1.0"
