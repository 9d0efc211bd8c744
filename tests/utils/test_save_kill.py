"""kill -9 during pyflow.save, again and again: the checkpoint at the path is
always a whole earlier save, and the next save leaves no temporary file."""
import os
import random
import signal
import subprocess
import sys
import time

import numpy as np
import pytest

import pyflow as pf

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
KILLS = 10
ELEMENTS = 1 << 21        # 8 MB of float32 per save

# Saves step k (every element of w equal to k) to argv[1], starting at
# argv[2]; prints each step saved; after the first save waits for a line on
# stdin, then saves forever.
_SAVER = r"""
import sys
import numpy as np
import pyflow as pf
path, step = sys.argv[1], int(sys.argv[2])
def save(k):
    pf.save({"step": k, "w": pf.from_numpy(np.full(%d, k, np.float32))}, path)
    print(k, flush=True)
save(step)
sys.stdin.readline()
while True:
    step += 1
    save(step)
""" % ELEMENTS


def _check_whole(path, at_least):
    ckpt = pf.load(path)
    step = ckpt["step"]
    w = ckpt["w"].numpy()
    assert step >= at_least and w.shape == (ELEMENTS,), (step, at_least, w.shape)
    assert np.all(w == step), f"checkpoint of step {step} holds other values"
    return step


@pytest.mark.skipif(os.name != "posix", reason="SIGKILL is POSIX's")
def test_kill_during_save_loop(tmp_path):
    path = tmp_path / "ckpt.safetensors"
    rng = random.Random(0)
    env = dict(os.environ, PYTHONPATH=ROOT)
    step, orphans, deadline = 0, 0, time.monotonic() + 120
    for _ in range(KILLS):
        proc = subprocess.Popen([sys.executable, "-c", _SAVER, str(path), str(step + 1)],
                                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
                                env=env, cwd=ROOT)
        try:
            first = int(proc.stdout.readline())
            # paused after one whole save: it removed the killed save's file
            assert os.listdir(tmp_path) == [path.name], os.listdir(tmp_path)
            assert _check_whole(path, first) == first
            t0 = time.monotonic()
            proc.stdin.write("go\n")
            proc.stdin.flush()
            second = int(proc.stdout.readline())          # one save's time, to aim within
            save_time = time.monotonic() - t0
            time.sleep(rng.uniform(0, 2 * save_time))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.wait()
            proc.stdout.close()
            proc.stdin.close()
        step = _check_whole(path, second)                    # a whole earlier save
        orphans += len(os.listdir(tmp_path)) - 1                # the killed save's file
        assert time.monotonic() < deadline, "the kill loop is far slower than expected"
    # most kills land inside a save (the saver does little else); some must
    # have, or the loop checked nothing
    assert orphans >= 1, "no kill landed during a save"
    pf.save({"step": -1}, path)
    assert os.listdir(tmp_path) == [path.name]
