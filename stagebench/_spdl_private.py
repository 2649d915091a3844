"""The one place that imports SPDL's private names (checked by ``tests/test_architecture.py``).

stagebench needs a few things SPDL does not export: the module whose function
builds a pipeline in diagnostic mode (replaced by the stand-in), the helpers
that tell how SPDL would run a callable, the pipe types and arguments of a
``PipelineConfig`` (to rebuild one stage alone), and the batch fetcher of its
PyTorch-style loader (to tell automatic batching). Each is resolved here,
lazily, so an SPDL upgrade that moves one breaks in one file. Reading a
config's private attributes (``cfg._args``, ``cfg._type``) stays in
:mod:`stagebench.pipeline._isolate`, the one reader of pipeline configs.
Importing this module imports nothing: it is loaded at interpreter start while
diagnostic mode is on.
"""

from __future__ import annotations

import sys

# Not `from typing import ...`: this module loads at interpreter start while diagnostic mode is on.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any

__all__ = [
    "MODE_VAR",
    "TRUTHY",
    "PROFILE_MODULE",
    "PYTORCH_DATALOADER_MODULE",
    "is_async_callable",
    "is_asyncgen_callable",
    "is_process_pool",
    "main_process_class",
    "pipe_args_class",
    "pipe_type",
    "pytorch_get_items",
    "caller_num_threads",
]

#: The variable that turns diagnostic mode on (SPDL's own name for it).
MODE_VAR = "SPDL_PIPELINE_DIAGNOSTIC_MODE"
#: SPDL's own spelling of "true" (spdl.pipeline._common._misc._get_env_bool).
TRUTHY = ("1", "true", "TRUE", "on", "ON", "yes", "YES")
#: The module whose ``_build_pipeline_diagnostic_mode`` SPDL calls when the mode is on.
PROFILE_MODULE = "spdl.pipeline._profile"
#: The module that defines SPDL's ``PyTorchDataLoader``.
PYTORCH_DATALOADER_MODULE = "spdl.dataloader._pytorch_dataloader"


def is_async_callable(op: Any) -> bool:
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline._common._convert import _is_async_callable

    return bool(_is_async_callable(op))


def is_asyncgen_callable(op: Any) -> bool:
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline._common._convert import _is_asyncgen_callable

    return bool(_is_asyncgen_callable(op))


def is_process_pool(executor: Any) -> bool:
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline._common._convert import _is_process_pool

    return bool(_is_process_pool(executor))


def pipe_type() -> Any:
    """The enum of pipe kinds (``OrderedPipe``, ...) a ``PipeConfig`` carries."""
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline.defs import _PipeType

    return _PipeType


def pipe_args_class() -> Any:
    """The arguments record inside a ``PipeConfig`` (op, executor, concurrency, ...)."""
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline.defs import _PipeArgs

    return _PipeArgs


def main_process_class() -> Any:
    """The placement marker that closes a sub-process region of a pipeline."""
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.pipeline.defs import _MainProcess

    return _MainProcess


def pytorch_get_items() -> Any:
    """The fetch function SPDL's PyTorch-style loader uses with automatic batching."""
    # spdl loads where it is used: this module is imported while spdl itself is being imported
    from spdl.dataloader import _pytorch_dataloader

    return _pytorch_dataloader._get_items


def caller_num_threads(depth: int = 2) -> int | None:
    """``num_threads`` of the ``build_pipeline`` call that handed a config to diagnostic mode, or None.

    SPDL's ``build_pipeline(cfg, num_threads=...)`` calls the diagnostic-mode builder with the
    config alone; the size of the shared thread pool the user chose is a local of that call.
    ``depth``: frames between the caller of this function and ``build_pipeline``.
    """
    try:
        frame = sys._getframe(depth)
    except ValueError:
        return None
    if frame.f_code.co_name != "build_pipeline":
        return None
    n = frame.f_locals.get("num_threads")
    return n if isinstance(n, int) and not isinstance(n, bool) and n > 0 else None
