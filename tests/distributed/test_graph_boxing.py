"""Boxing as graph nodes: ``graph_boxing_worker.py`` under ``mpirun -n 2``
trains a tensor-parallel GPT block in a compiled graph with the eager SBP
dispatch refused after the compile (equal to one rank), and checks that
``explain``/``to_dot`` show the box nodes with their collective and bytes."""
import os

import pytest

from ..rank_checks import assert_all_ranks_passed
from .test_distributed import HERE, pyflow_run


@pytest.mark.cpu_only
def test_compiled_tensor_parallel_step_boxes_in_nodes_without_eager_dispatch():
    proc = pyflow_run(2, os.path.join(HERE, "graph_boxing_worker.py"))
    assert_all_ranks_passed(proc, 2, 2)
