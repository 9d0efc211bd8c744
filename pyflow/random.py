"""Random number generators: a counter-based Philox stream per Generator.

Philox (NumPy's ``Philox`` bit generator) is counter-based, so a state is just
(key, counter): cheap to save in checkpoints and the same scheme the CUDA
kernels use for reproducible dropout.
"""
import json

import numpy as np

from . import dtypes as _dt
from .tensor import Tensor

__all__ = ["Generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
           "set_rng_state", "default_generator"]

# Draws are made this many at a time (512 KiB of float64 scratch), see ``fill``.
DRAW_CHUNK = 1 << 16
_TAKE_OUT = ("random", "standard_normal")     # NumPy methods that write into out=/float64


class Generator:
    def __init__(self, device="cpu"):
        self.device = device
        self.manual_seed(67280421310721)

    def manual_seed(self, seed):
        if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
            raise TypeError(f"manual_seed: seed must be an int, got {seed!r}")
        self._seed = int(seed) & 0xFFFFFFFFFFFFFFFF
        self._rng = np.random.Generator(np.random.Philox(self._seed))
        return self

    def seed(self):
        s = int(np.random.SeedSequence().entropy) & 0xFFFFFFFFFFFFFFFF
        self.manual_seed(s)
        return s

    def initial_seed(self):
        return self._seed

    def get_state(self):
        """The generator state as a uint8-valued int64 tensor (JSON of Philox's key/counter)."""
        state = json.dumps(self._rng.bit_generator.state, default=_jsonable)
        return Tensor._make(np.frombuffer(state.encode(), np.uint8).astype(np.int64), _dt.int64)

    def set_state(self, state):
        raw = bytes(np.asarray(state._data, np.uint8))
        try:
            st = json.loads(raw.decode())
            for part in ("state", "buffer"):  # Philox keeps counter/key/buffer as uint64 arrays
                if isinstance(st.get(part), dict):
                    st[part] = {k: np.asarray(v, np.uint64) if isinstance(v, list) else v
                                for k, v in st[part].items()}
                elif isinstance(st.get(part), list):
                    st[part] = np.asarray(st[part], np.uint64)
            self._rng.bit_generator.state = st
        except (ValueError, KeyError, TypeError) as e:
            raise ValueError(f"set_state: not a state from Generator.get_state() ({e})") from None
        return self

    def draw_seed(self):
        """One fresh 64-bit seed for a counter-based kernel (dropout's Philox);
        advances the generator.  Graph tracing (pyflow.graph.tracer) intercepts
        this call, so a compiled graph draws a new seed on every run."""
        return int(self._rng.integers(0, 1 << 64, dtype=np.uint64))

    @property
    def numpy(self):
        """The underlying NumPy Generator (for kernels that draw numbers)."""
        return self._rng


def _jsonable(x):
    if isinstance(x, np.ndarray):
        return x.tolist()
    if isinstance(x, np.integer):
        return int(x)
    raise TypeError(f"cannot serialise {type(x).__name__}")


default_generator = Generator()


def manual_seed(seed):
    return default_generator.manual_seed(seed)


def seed():
    return default_generator.seed()


def initial_seed():
    return default_generator.initial_seed()


def get_rng_state():
    return default_generator.get_state()


def set_rng_state(state):
    default_generator.set_state(state)


def generator_of(gen):
    if gen is None:
        return default_generator
    if not isinstance(gen, Generator):
        raise TypeError(f"generator: expected a pyflow.Generator, got {type(gen).__name__}")
    return gen


def fill(generator, out, kind, convert=None, **params):
    """Fill the C-contiguous NumPy array ``out`` (any numeric dtype) with the numbers
    one call ``generator.numpy.<kind>(size=out.size, **params)`` would give
    (``kind``: "random", "standard_normal", "integers", "normal", "uniform"...).

    They are drawn DRAW_CHUNK at a time in NumPy's float64/int64 and stored into
    ``out`` (through ``convert(piece)`` when given), so the peak extra memory is one
    piece, not a float64 copy of the whole result (3x a float32 result).  A Philox
    stream continues across calls, so the numbers, and the generator's state after,
    are exactly those of the single call: seeds give the same tensors as before."""
    if not out.flags.c_contiguous:
        raise ValueError("fill(): out must be a C-contiguous array")
    rng = generator_of(generator).numpy
    flat = out.reshape(-1)                         # a view: out is contiguous
    n = flat.size
    direct = kind in _TAKE_OUT and not params
    if direct and convert is None and out.dtype == np.float64:
        getattr(rng, kind)(out=flat)               # straight into the result
        return out
    scratch = np.empty(min(n, DRAW_CHUNK)) if direct else None
    for start in range(0, n, DRAW_CHUNK):
        m = min(DRAW_CHUNK, n - start)
        piece = getattr(rng, kind)(out=scratch[:m]) if direct else \
            getattr(rng, kind)(size=m, **params)
        flat[start:start + m] = piece if convert is None else convert(piece)
    return out

