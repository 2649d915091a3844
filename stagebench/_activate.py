"""Activation of diagnostic mode, imported from ``stagebench_activate.pth``.

Only reached when ``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is truthy, so an ordinary
interpreter start pays one environment lookup. It installs a post-import hook
instead of importing spdl now: start-up stays fast, and processes that never
build a pipeline (pool workers) never pay for spdl.
"""

from __future__ import annotations

import sys

__all__ = ["install", "installed", "uninstall", "PostImportFinder"]

#: module whose import triggers the patch
_SPDL_PROFILE = "spdl.pipeline._profile"


class PostImportFinder:
    """Calls ``on_import(module)`` right after any of ``targets`` is executed.

    Patching on import (rather than importing the target now) keeps start-up
    fast and lets processes that never import it pay nothing. A plain class with
    ``find_spec`` (the meta-path protocol): importing ``importlib.abc`` for the
    base class would cost most of activation's time. Also used by the DataLoader
    hook (``_loader_intercept``).
    """

    def __init__(self, targets, on_import) -> None:  # noqa: ANN001
        self.targets = frozenset(targets)
        self.on_import = on_import

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname not in self.targets:
            return None
        # Find the real spec with the rest of the meta path (skip ourselves).
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, self.on_import)
                return spec
        return None


class _PatchingLoader:
    def __init__(self, inner, on_import) -> None:  # noqa: ANN001
        self._inner = inner
        self._on_import = on_import

    def create_module(self, spec):  # noqa: ANN001
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self._inner.exec_module(module)
        self._on_import(module)


def _patch_spdl(module) -> None:  # noqa: ANN001
    from . import _diagnose

    _diagnose.patch_spdl(module)


# SPDL's own spelling of "true" (spdl.pipeline._common._misc._get_env_bool).
_TRUTHY = ("1", "true", "TRUE", "on", "ON", "yes", "YES")


def install() -> None:
    """Arrange for stagebench to replace SPDL's diagnostic mode when spdl is imported.

    The .pth line only checks that the variable exists (the shortest line compiles
    fastest: every interpreter start pays for it); its value is checked here.
    """
    import os

    if os.environ.get("SPDL_PIPELINE_DIAGNOSTIC_MODE", "0") not in _TRUTHY:
        return
    if installed():
        return
    if _SPDL_PROFILE in sys.modules:  # already imported: patch in place
        _patch_spdl(sys.modules[_SPDL_PROFILE])
    sys.meta_path.insert(0, PostImportFinder((_SPDL_PROFILE,), _patch_spdl))


def installed() -> bool:
    """Whether :func:`install` put its post-import hook in this process."""
    return any(getattr(f, "on_import", None) is _patch_spdl for f in sys.meta_path)


def uninstall() -> None:
    """Undo :func:`install`: remove the hook and give SPDL its own diagnostic mode back.

    For ``stagebench diagnose`` run inside a longer-lived process (a test, a
    notebook): the hook would otherwise stay in every later import, and a later
    pipeline built with the variable set would be replaced by the stand-in.
    """
    sys.meta_path[:] = [f for f in sys.meta_path if getattr(f, "on_import", None) is not _patch_spdl]
    profile = sys.modules.get(_SPDL_PROFILE)
    current = getattr(profile, "_build_pipeline_diagnostic_mode", None)
    if getattr(current, "_stagebench", False):
        profile._build_pipeline_diagnostic_mode = current._spdl_original
