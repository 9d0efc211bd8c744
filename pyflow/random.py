"""Random number generators: a counter-based Philox stream per Generator.

Philox (NumPy's ``Philox`` bit generator) is counter-based, so a state is just
(key, counter): cheap to save in checkpoints and the same scheme the CUDA
kernels use for reproducible dropout.
"""
import numpy as np

__all__ = ["Generator", "manual_seed", "seed", "initial_seed", "get_rng_state",
           "set_rng_state", "default_generator"]


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
        from .ops.creation import tensor
        import json
        state = json.dumps(self._rng.bit_generator.state)
        return tensor(np.frombuffer(state.encode(), np.uint8).astype(np.int64))

    def set_state(self, state):
        import json
        raw = bytes(np.asarray(state._data, np.uint8))
        self._rng.bit_generator.state = json.loads(raw.decode())
        return self

    @property
    def numpy(self):
        """The underlying NumPy Generator (for kernels that draw numbers)."""
        return self._rng


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
