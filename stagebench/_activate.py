"""Activation of diagnostic mode, imported from ``stagebench_activate.pth``.

Only reached when ``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is set, so an ordinary
interpreter start pays one environment lookup. It installs a post-import hook
instead of importing spdl now (:mod:`stagebench.pipeline._spdl_hook`): start-up
stays fast, and processes that never build a pipeline (pool workers) never pay
for spdl. The ``.pth`` file names this module; the hook itself lives with the
diagnostic mode it starts.
"""

from __future__ import annotations

from stagebench.pipeline._spdl_hook import install

__all__ = ["install"]
