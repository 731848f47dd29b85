"""Partial, interleaved multimodal RoPE (Qwen3.5 text rotary embedding).

Only the first `rotary_dim` dims of each head rotate, NeoX style (`rotate_half` over the
rotary slice). Frequency j uses the T, H or W coordinate of the token's 3-D position in the
interleaved layout that transformers uses for Qwen3.5 (H at j = 1, 4, ... < 3*section[1],
W at j = 2, 5, ... < 3*section[2], T elsewhere). Text tokens have t = h = w, so this is plain
RoPE for text.
"""

from __future__ import annotations

import numpy as np

from inferno.model.config import ModelConfig


def frequency_axes(config: ModelConfig) -> np.ndarray:
    """For each of the rotary_dim/2 frequencies, which position axis (0=T, 1=H, 2=W) drives it."""
    axes = np.zeros(config.rotary_dim // 2, np.int64)
    for axis in (1, 2):
        axes[axis : 3 * config.mrope_section[axis] : 3] = axis
    return axes


def rope_tables(config: ModelConfig, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """cos, sin `[T, rotary_dim]` for positions `[T]` (text) or `[3, T]` (T/H/W per token)."""
    positions = np.asarray(positions, np.float64)
    if positions.ndim == 1:
        positions = np.broadcast_to(positions, (3, positions.shape[0]))
    half = config.rotary_dim // 2
    inv_freq = 1.0 / config.rope_theta ** (np.arange(half, dtype=np.float64) * 2.0 / config.rotary_dim)
    coords = positions[frequency_axes(config)]  # [half, T]: the coordinate each frequency uses
    angles = (coords * inv_freq[:, None]).T  # [T, half]
    angles = np.concatenate([angles, angles], axis=-1)
    return np.cos(angles).astype(np.float32), np.sin(angles).astype(np.float32)


def apply_rope(x: np.ndarray, cos: np.ndarray, sin: np.ndarray) -> np.ndarray:
    """Rotate the first rotary_dim dims of `x` `[T, heads, head_dim]`; the rest pass through."""
    rot = cos.shape[-1]
    half = rot // 2
    cos, sin = cos[:, None, :], sin[:, None, :]
    xr = x[..., :rot]
    rotated = np.concatenate([-xr[..., half:], xr[..., :half]], axis=-1)
    out = x.copy()
    out[..., :rot] = xr * cos + rotated * sin
    return out
