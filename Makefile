# Two commands on a fresh machine (Python 3.11 + pip):  make demo   and   make test
PYTHON ?= python3
VENV := .venv
PY := $(VENV)/bin/python
STAMP := $(VENV)/.installed

.PHONY: demo digits test test-cpu test-cuda-sim bench clean

$(STAMP): setup.cfg pyproject.toml
	$(PYTHON) -m venv $(VENV)
	$(PY) -m pip install -q --upgrade pip
	$(PY) -m pip install -q -e ".[test,plot,mkl]"
	touch $(STAMP)

# The main job: GPT (tiny preset) data-parallel on 2 MPI ranks in graph mode, on a character
# corpus built from the project's own docs and sources; log and plot in runs/demo.
demo: $(STAMP)
	$(VENV)/bin/pyflow-run -n 2 models/train.py --model gpt --preset tiny --graph --batch-size 32 \
		--steps 1000 --lr 3e-3 --eval-every 200 --out runs/demo

# The first demo: an MLP on generated digits, one process, about 5 s.
digits: $(STAMP)
	$(PY) -m pyflow.models.demo

# The whole suite, then the op and graph tests again with every tensor on the
# cuda device, run by numba's CUDA simulator (no GPU needed).  JOBS pytest
# workers (pytest-xdist) share the tests: most are one Python thread, so two
# workers on CI's two cores run the suite ~1.5x faster than one (647 s -> 427 s here).
# --durations lists the slowest tests in the log, where a new slow one shows.
JOBS ?= 2
test: test-cpu test-cuda-sim

# The workers are processes sharing the cores, the case where OpenMP threads
# should sleep at once (pyflow/_threads.py): 20 s instead of 25 s on three op files.
test-cpu: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE $(PY) -m pytest -n $(JOBS) --dist worksteal --durations=25

test-cuda-sim: $(STAMP)
	OMP_WAIT_POLICY=PASSIVE NUMBA_ENABLE_CUDASIM=1 PYFLOW_TEST_DEVICE=cuda HYPOTHESIS_PROFILE=sim \
		$(PY) -m pytest -n $(JOBS) --dist worksteal --durations=25 tests/ops tests/graph -m "not cpu_only"

bench: $(STAMP)
	$(PY) bench/run_all.py

clean:
	rm -rf $(VENV) build *.egg-info
