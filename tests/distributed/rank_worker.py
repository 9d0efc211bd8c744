"""Run by the launcher tests: prints what ``pyflow.distributed.env`` says on this
rank, then exits with the code given for this rank (``--exit R:CODE``)."""
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from pyflow.distributed import env  # noqa: E402

rank, size = env.get_rank(), env.get_world_size()
split = env._node().Get_rank() if size > 1 else 0       # the shared-memory answer
print(f"rank {rank} of {size}: local {env.get_local_rank()} split {split} "
      f"local_size {env.get_local_world_size()} args {sys.argv[1:]}", flush=True)
codes = dict(a.split(":") for a in sys.argv[1:] if ":" in a)
sys.exit(int(codes.get(str(rank), 0)))
