"""The resource table of docs/cuda.md: ptxas -v for sm_90 over the production
GEMM variants and every kernel a ``kernels/cuda`` module lists in
``kernel_specs()``.  No GPU needed (NVVM and ptxas come with numba-cuda[cu12]).

    python tests/kernels/cuda_resources.py            # print the table
    python tests/kernels/cuda_resources.py --write    # rewrite it in docs/cuda.md

The budgets are tests (test_cuda_linalg_conv_ptx.py, test_cuda_rows_ptx.py);
this script only reports.  Occupancy is theoretical (``cudatools.occupancy``):
resident threads over the 2,048 an sm_90 multiprocessor holds, for blocks of
the kernel's launch size (256 threads for the GEMM and the row kernels).
"""
import argparse
import os
import pathlib
import subprocess
import sys
import types

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

import numba.cuda.dispatcher as cuda_dispatcher  # noqa: E402
import numpy as np  # noqa: E402
from numba import cuda  # noqa: E402

from pyflow.kernels.cuda import linalg  # noqa: E402
from tests.kernels.cudatools import occupancy, ptxas, ptxas_resources, spec_modules  # noqa: E402

CC = (9, 0)
DOC = ROOT / "docs" / "cuda.md"
BEGIN, END = "<!-- resources: begin -->", "<!-- resources: end -->"
THREADS = 256


def gemm_label(dtype, tile, a_k, b_n, bias):
    return (f"gemm {np.dtype(dtype).name} {tile.BM}x{tile.BN}x{tile.BK} "
            f"A {'k' if a_k else 'm'}-contiguous, B {'n' if b_n else 'k'}-contiguous"
            f"{' + bias' if bias else ''}")


def gemm_specs():
    """Every GEMM variant ``launch_gemm`` can compile: the tiles of each dtype, both
    load layouts of each operand, with and without the epilogue."""
    return [(dtype, tile, a_k, b_n, bias) for dtype in linalg.DTYPES
            for tile in linalg.tiles(dtype)
            for a_k in (True, False) for b_n in (True, False) for bias in (False, True)]


def kernels():
    """[(label, plain function, signature, launch bounds, threads a block)]."""
    found = [(gemm_label(*spec), linalg.gemm_function(*spec), linalg.gemm_signature(spec[0]),
              linalg.gemm_launch_bounds(*spec[:2]), THREADS) for spec in gemm_specs()]
    for name, module in spec_modules().items():
        found += [(f"{name}: {label}", fn, sig, None, THREADS)
                  for label, fn, sig in module.kernel_specs()]
    return found


def rows():
    cuda_dispatcher.get_current_device = lambda: types.SimpleNamespace(compute_capability=CC)
    out = []
    for label, fn, sig, bounds, threads in kernels():
        ptx, _ = cuda.compile_ptx(fn, sig, cc=CC, launch_bounds=bounds)
        used = ptxas_resources(ptx, CC)
        spills = used["spill_stores"] + used["spill_loads"] + used["stack"]
        out.append((label, used["registers"], used["shared"], spills,
                    occupancy(used["registers"], used["shared"], threads)))
    return out


def table(found):
    version = subprocess.run([ptxas(), "--version"], capture_output=True,
                             text=True).stdout.strip().splitlines()[-1]
    lines = [f"sm_90, {version}; occupancy for blocks of {THREADS} threads.", "",
             "| kernel | registers | shared bytes | spilled bytes | occupancy |",
             "|---|---|---|---|---|"]
    lines += [f"| {label} | {regs} | {shared} | {spills} | {occ:.0%} |"
              for label, regs, shared, spills, occ in found]
    return "\n".join(lines)


def main():
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", action="store_true", help=f"rewrite the table in {DOC}")
    args = parser.parse_args()
    text = table(rows())
    if not args.write:
        print(text)
        return
    doc = DOC.read_text()
    head, rest = doc.split(BEGIN)
    _, tail = rest.split(END)
    DOC.write_text(f"{head}{BEGIN}\n{text}\n{END}{tail}")
    print(f"wrote {len(text.splitlines()) - 4} rows into {os.path.relpath(DOC)}")


if __name__ == "__main__":
    main()
