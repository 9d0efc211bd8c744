"""The model zoo with parallelism through SBP: ``parallel_worker.py`` under
``mpirun -n 2`` and ``-n 4`` trains BERT (data, tensor, and on 4 ranks 2-D data
x tensor parallel, eager and graph) and ResNet (data parallel, eager and graph)
and compares with one rank."""
import os

import pytest

from ..distributed.test_distributed import pyflow_run
from ..rank_checks import assert_all_ranks_passed

HERE = os.path.dirname(os.path.abspath(__file__))


@pytest.mark.slow
@pytest.mark.cpu_only
@pytest.mark.parametrize("n, checks", [(2, 4), (4, 5)])
def test_bert_and_resnet_parallel_equal_one_rank(n, checks):
    proc = pyflow_run(n, os.path.join(HERE, "parallel_worker.py"))
    assert_all_ranks_passed(proc, n, checks)
