"""A generated digits data set: 28x28 grey images of the digits 0-9.

Each image is one of ten 5x7 glyphs, drawn with a random scale, slant,
rotation, position and stroke weight, then blurred and noised, so the task
is real (a model must learn shapes under distortion) yet nothing is downloaded.
``make_digits(n, seed)`` is deterministic for a seed.
"""
import numpy as np

_GLYPHS = [
    ["01110", "10001", "10011", "10101", "11001", "10001", "01110"],  # 0
    ["00100", "01100", "00100", "00100", "00100", "00100", "01110"],  # 1
    ["01110", "10001", "00001", "00010", "00100", "01000", "11111"],  # 2
    ["11111", "00010", "00100", "00010", "00001", "10001", "01110"],  # 3
    ["00010", "00110", "01010", "10010", "11111", "00010", "00010"],  # 4
    ["11111", "10000", "11110", "00001", "00001", "10001", "01110"],  # 5
    ["00110", "01000", "10000", "11110", "10001", "10001", "01110"],  # 6
    ["11111", "00001", "00010", "00100", "01000", "01000", "01000"],  # 7
    ["01110", "10001", "10001", "01110", "10001", "10001", "01110"],  # 8
    ["01110", "10001", "10001", "01111", "00001", "00010", "01100"],  # 9
]
GLYPHS = np.array([[[c == "1" for c in row] for row in g] for g in _GLYPHS], np.float32)
SIZE = 28


def _render(glyph_ids, rng):
    """Sample each glyph through a random affine map onto a 28x28 grid."""
    n = len(glyph_ids)
    scale = rng.uniform(2.6, 3.4, n)                     # pixels per glyph cell
    angle = rng.uniform(-0.25, 0.25, n)                  # radians
    slant = rng.uniform(-0.3, 0.3, n)
    shift = rng.uniform(-2.5, 2.5, (n, 2))
    ys, xs = np.mgrid[0:SIZE, 0:SIZE].astype(np.float32)
    ys, xs = ys - SIZE / 2 + 0.5, xs - SIZE / 2 + 0.5
    c, s = np.cos(angle)[:, None, None], np.sin(angle)[:, None, None]
    y = ys[None] - shift[:, 0, None, None]
    x = xs[None] - shift[:, 1, None, None]
    gy = (c * y - s * x) / scale[:, None, None] + 3.5          # glyph row coordinate
    gx = (s * y + c * x) / scale[:, None, None] + 2.5 + slant[:, None, None] * (gy - 3.5)
    iy, ix = np.floor(gy).astype(int), np.floor(gx).astype(int)
    fy, fx = gy - iy, gx - ix
    padded = np.pad(GLYPHS[glyph_ids], ((0, 0), (1, 1), (1, 1)))   # zero border
    b = np.arange(n)[:, None, None]

    def at(r, q):
        r, q = np.clip(r + 1, 0, 8), np.clip(q + 1, 0, 6)
        return padded[b, r, q]
    img = ((1 - fy) * (1 - fx) * at(iy, ix) + (1 - fy) * fx * at(iy, ix + 1)
           + fy * (1 - fx) * at(iy + 1, ix) + fy * fx * at(iy + 1, ix + 1))
    weight = rng.uniform(0.6, 1.0, n)[:, None, None]
    img = np.clip(img * 1.6 * weight, 0, 1)
    img = (img + np.roll(img, 1, 1) + np.roll(img, 1, 2)) / 2.2           # soft strokes
    img = img + rng.normal(0, 0.15, img.shape)
    return np.clip(img, 0, 1).astype(np.float32)


def make_digits(n, seed=0):
    """``n`` images (n, 1, 28, 28) float32 in [0, 1] and labels (n,) int64."""
    rng = np.random.default_rng(seed)
    labels = rng.integers(0, 10, n)
    images = np.concatenate([_render(labels[i:i + 4096], rng) for i in range(0, n, 4096)])
    return images[:, None], labels.astype(np.int64)
