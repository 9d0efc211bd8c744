"""The main job trains to the accuracy the README claims (>= 98% held out)."""
import numpy as np
import pytest

from pyflow.models import demo
from pyflow.models.digits import make_digits


def test_digits_are_deterministic_and_balanced():
    x1, y1 = make_digits(500, seed=3)
    x2, y2 = make_digits(500, seed=3)
    assert x1.shape == (500, 1, 28, 28) and x1.dtype == np.float32
    assert np.array_equal(x1, x2) and np.array_equal(y1, y2)
    assert 0.0 <= x1.min() and x1.max() <= 1.0
    assert set(np.unique(y1)) == set(range(10))


@pytest.mark.slow
def test_demo_reaches_claimed_accuracy(capsys):
    acc = demo.main([])
    out = capsys.readouterr().out
    assert "samples/s" in out and "test accuracy" in out
    assert acc >= 0.98
