"""Fuzz tests: ops and modules on bad shapes, dtypes, indices, sizes, NaN/inf and
wrong argument types, each case run on pyflow and on PyTorch (the reference).

A case passes when the two agree on its outcome:

* both return: the results have the same structure, shapes and dtypes, and
  equal values (``allclose`` at the dtype's tolerance, NaN in the same places,
  infinities equal);
* both raise: pyflow's exception belongs to the same family as PyTorch's.  The
  families are the four classes PyTorch raises for bad input, ``TypeError``,
  ``ValueError``, ``IndexError`` and ``RuntimeError``: torch's exception is
  placed in the first of them it is an instance of, and pyflow's must be an
  instance of that class too.  So torch's own subclasses
  (``NotImplementedError``, ``torch.OutOfMemoryError``, ``_LinAlgError``: all
  ``RuntimeError``) match a plain ``RuntimeError`` from pyflow, and pyflow may
  raise its own subclasses (``KernelNotFound``, ``TracingError``: both
  ``RuntimeError``).  ``ValueError`` is a subclass of none of the others, so a
  ``ValueError`` where torch raises ``RuntimeError`` (or the reverse) fails.
  An exception outside the four families (``AssertionError`` for a bad
  ``padding_idx``, say) must be of the same class as torch's.  One documented
  difference: where torch leaks an ``AttributeError`` for an argument that is not
  a tensor (``nn.MSELoss()(x, None)``, ``nn.BatchNorm2d(3)(None)``: its Python
  code calls ``.size()`` or ``.dim()`` on it), pyflow raises ``TypeError``
  naming the argument.  pyflow never lets an ``AttributeError`` out, and its
  message is never numba's (``TypingError``, ``No implementation of function``);
* anything else (one raises, the other returns) fails: pyflow accepting what
  torch rejects is a silent wrong answer, the reverse a missing feature.

Every case runs under a hard time limit (``harness.CASE_SECONDS``, SIGALRM, with
``faulthandler`` ending the process should a kernel never return to Python), so
a hang fails instead of stalling CI.  The tests are derandomized (fixed examples
from the ``ci`` profile in tests/conftest.py, no example database) and marked
``cpu_only``; the whole suite takes well under a minute.
"""
