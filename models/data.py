"""Data for the trainer: a character-level corpus of pyflow's own text, and
DLPerf-style synthetic batches.

**The corpus** is the text the project ships, so the demo needs no download:
README.md, docs/*.md, then the ``.py`` files of pyflow/, kernels/, comm/ and
models/, each group in sorted path order, concatenated (about 1 MB, ~95
distinct characters).  Files are found relative to this module, so it works
from a clone (``models/`` beside ``pyflow/``) and from an installed package
(the documentation is then absent, the sources are found through their
packages).  The vocabulary is the set of characters present, sorted; the
first 90% of the token stream is the training split, the last 10% held out
(nanoGPT's shakespeare_char recipe).

**Batches** are ``block_size`` windows at offsets drawn from a
``pyflow.Generator``: the generator's state *is* the data position, so a
checkpoint that saves it resumes the exact batch sequence.

**Synthetic batches** (DLPerf's throughput method): uniform random tokens or
images, never read from disk, so a run measures the model and not the input
pipeline.
"""
import hashlib
import os

import numpy as np

import pyflow

__all__ = ["CharCorpus", "SyntheticTokens", "SyntheticImages", "Digits", "project_text_files"]

SPLITS = ("train", "val")
_PACKAGES = ("pyflow", "pyflow.kernels", "pyflow.comm", "pyflow.models")


def _check_split(split):
    if split not in SPLITS:
        raise ValueError(f"get_batch: split must be 'train' or 'val', got {split!r}")


def _check_positive(fn, **values):
    for name, v in values.items():
        if isinstance(v, bool) or not isinstance(v, (int, np.integer)) or v < 1:
            raise ValueError(f"{fn}: {name} must be a positive int, got {v!r}")


def _py_files(folder, skip=()):
    out = []
    for dirpath, dirnames, filenames in os.walk(folder):
        dirnames[:] = sorted(d for d in dirnames if d != "__pycache__"
                             and os.path.join(dirpath, d) not in skip)
        out += [os.path.join(dirpath, f) for f in sorted(filenames) if f.endswith(".py")]
    return sorted(out, key=lambda p: os.path.relpath(p, folder))


def project_text_files():
    """The corpus files in their fixed order (absolute paths)."""
    here = os.path.dirname(os.path.abspath(__file__))
    root = os.path.dirname(here)
    files = []
    if os.path.isfile(os.path.join(root, "README.md")) and os.path.isdir(
            os.path.join(root, "pyflow")):        # a checkout: the top-level folders side by side
        files.append(os.path.join(root, "README.md"))
        docs = os.path.join(root, "docs")
        if os.path.isdir(docs):
            files += sorted(os.path.join(docs, f) for f in os.listdir(docs) if f.endswith(".md"))
        for folder in ("pyflow", "kernels", "comm", "models"):
            files += _py_files(os.path.join(root, folder))
        return files
    # an installed package: kernels/comm/models live inside pyflow/, list them once each
    import importlib
    folders = [os.path.dirname(importlib.import_module(p).__file__) for p in _PACKAGES]
    for i, folder in enumerate(folders):
        files += _py_files(folder, skip=set(folders[:i] + folders[i + 1:]))
    return files


class CharCorpus:
    """A character-level corpus: ``vocab`` (the characters, sorted), ``train``
    and ``val`` token arrays (int64), ``encode``/``decode``."""

    def __init__(self, text, name="text", val_fraction=0.1):
        if not isinstance(text, str) or len(text) < 2:
            raise ValueError(f"CharCorpus: {name} holds no text to train on")
        if not 0.0 < val_fraction < 1.0:
            raise ValueError(f"CharCorpus: val_fraction must be in (0, 1), got {val_fraction!r}")
        self.name = name
        # identifies the text in checkpoints: resuming on other text would not
        # reproduce the run (the project's corpus changes with its sources)
        self.digest = hashlib.sha256(text.encode("utf-8", "surrogatepass")).hexdigest()[:16]
        codes = np.frombuffer(text.encode("utf-32-le", "surrogatepass"), np.uint32)
        chars = np.unique(codes)
        self.vocab = "".join(chr(c) for c in chars)
        self._codes = chars
        self.stoi = {ch: i for i, ch in enumerate(self.vocab)}
        tokens = np.searchsorted(chars, codes).astype(np.int64)
        n = int(len(tokens) * (1.0 - val_fraction))
        self.train, self.val = tokens[:n], tokens[n:]

    @classmethod
    def from_project(cls):
        """pyflow's documentation and source text (see the module docstring)."""
        files = project_text_files()
        parts = []
        for path in files:
            with open(path, encoding="utf-8", errors="replace") as f:
                parts.append(f.read())
        corpus = cls("\n".join(parts), name=f"pyflow's own text ({len(files)} files)")
        corpus.files = files
        return corpus

    @classmethod
    def from_file(cls, path):
        """A UTF-8 text file; a missing or unreadable file is a clear error."""
        if not os.path.exists(path):
            raise FileNotFoundError(f"corpus {path!r} does not exist (pass --data synthetic, "
                                    f"--data chars for pyflow's own text, or the path of a "
                                    f"UTF-8 text file)")
        if not os.path.isfile(path):
            raise IsADirectoryError(f"corpus {path!r} is not a file (pass --data synthetic, "
                                    f"--data chars for pyflow's own text, or the path of a "
                                    f"UTF-8 text file)")
        with open(path, encoding="utf-8", errors="replace") as f:
            return cls(f.read(), name=os.path.basename(path))

    @property
    def vocab_size(self):
        return len(self.vocab)

    def encode(self, s):
        return [self.stoi[c] for c in s]

    def decode(self, ids):
        return "".join(self.vocab[int(i)] for i in ids)

    def get_batch(self, split, batch_size, block_size, generator=None, device=None):
        """``(x, y)``: ``batch_size`` windows of ``block_size`` tokens of ``split``
        and the same windows shifted by one (the next-token targets), int64."""
        _check_split(split)
        _check_positive("get_batch", batch_size=batch_size, block_size=block_size)
        data = self.train if split == "train" else self.val
        if len(data) <= block_size:
            raise ValueError(f"get_batch: the {split} split of {self.name} has {len(data)} "
                             f"tokens, too few for block_size {block_size}")
        rng = pyflow.random.generator_of(generator).numpy
        starts = rng.integers(0, len(data) - block_size, size=batch_size)
        window = starts[:, None] + np.arange(block_size)
        return (pyflow.from_numpy(data[window]).to(device or "cpu"),
                pyflow.from_numpy(data[window + 1]).to(device or "cpu"))


class SyntheticTokens:
    """Uniform random token ids (DLPerf-style throughput data); both splits alike."""

    def __init__(self, vocab_size):
        _check_positive("SyntheticTokens", vocab_size=vocab_size)
        self.vocab_size, self.name = vocab_size, "synthetic tokens"

    def get_batch(self, split, batch_size, block_size, generator=None, device=None):
        _check_split(split)
        _check_positive("get_batch", batch_size=batch_size, block_size=block_size)
        rng = pyflow.random.generator_of(generator).numpy
        tokens = rng.integers(0, self.vocab_size, size=(batch_size, block_size + 1))
        return (pyflow.from_numpy(np.ascontiguousarray(tokens[:, :-1])).to(device or "cpu"),
                pyflow.from_numpy(np.ascontiguousarray(tokens[:, 1:])).to(device or "cpu"))


class SyntheticImages:
    """Random images and labels for image classifiers (DLPerf-style)."""

    def __init__(self, shape=(1, 28, 28), num_classes=10):
        self.shape, self.num_classes, self.name = tuple(shape), num_classes, "synthetic images"

    def get_batch(self, split, batch_size, block_size=None, generator=None, device=None):
        _check_split(split)
        _check_positive("get_batch", batch_size=batch_size)
        rng = pyflow.random.generator_of(generator).numpy
        x = rng.standard_normal((batch_size,) + self.shape, dtype=np.float32)
        y = rng.integers(0, self.num_classes, size=batch_size)
        return pyflow.from_numpy(x).to(device or "cpu"), pyflow.from_numpy(y).to(device or "cpu")


class Digits:
    """The generated handwriting-like digits of ``models/digits.py`` (a real
    task for the MLP): a fixed training set and a held-out set, sampled with
    replacement like the corpus."""

    def __init__(self, n_train=20000, n_val=4000, seed=0):
        from .digits import make_digits
        self.name = "generated digits"
        self.splits = {"train": make_digits(n_train, seed=seed),
                       "val": make_digits(n_val, seed=seed + 1)}

    def get_batch(self, split, batch_size, block_size=None, generator=None, device=None):
        _check_split(split)
        _check_positive("get_batch", batch_size=batch_size)
        x, y = self.splits[split]
        rng = pyflow.random.generator_of(generator).numpy
        i = rng.integers(0, len(y), size=batch_size)
        return (pyflow.from_numpy(np.ascontiguousarray(x[i])).to(device or "cpu"),
                pyflow.from_numpy(np.ascontiguousarray(y[i]).astype(np.int64)).to(device or "cpu"))
