"""Test isolation for what the product sets in its own process on purpose.

A DataLoader diagnosis sets ``SPDL_PIPELINE_DIAGNOSTIC_MODE=0`` in its process (the program exits
after it, and SPDL's PyTorch-style loader must not start a second diagnosis); a test that runs the
hook in pytest's process would otherwise hand that to every later test. A test that provokes running
out of memory leaves the process noted as having run out (``stagebench._memory``): every later point
would then probe its memory first, and the exit would not wait for threads.
"""

from __future__ import annotations

import os

import pytest

from stagebench import _memory
from stagebench._spdl_private import MODE_VAR


@pytest.fixture(autouse=True)
def _restore_diagnostic_mode():
    before = os.environ.get(MODE_VAR)
    yield
    if before is None:
        os.environ.pop(MODE_VAR, None)
    else:
        os.environ[MODE_VAR] = before


@pytest.fixture(autouse=True)
def _forget_running_out_of_memory():
    yield
    _memory.forget()
