"""Every runtime test must leave no stream thread running a loop."""
import threading

import pytest


def stream_threads():
    return [t for t in threading.enumerate() if t.name.startswith("pyflow-stream-")]


@pytest.fixture(autouse=True)
def no_leftover_threads():
    yield
    assert stream_threads() == []
