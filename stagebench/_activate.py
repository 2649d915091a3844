"""Activation of diagnostic mode, imported from ``stagebench_activate.pth``.

Only reached when ``SPDL_PIPELINE_DIAGNOSTIC_MODE`` is truthy, so an ordinary
interpreter start pays one environment lookup. It installs a post-import hook
instead of importing spdl now: start-up stays fast, and processes that never
build a pipeline (pool workers) never pay for spdl.
"""

from __future__ import annotations

import sys

__all__ = ["install"]

_TARGETS: dict[str, str] = {
    # module whose import triggers the patch -> function in stagebench._diagnose
    "spdl.pipeline._profile": "patch_spdl",
}


class _PostImportFinder:
    """Wraps the loader of the target modules to run a patch after they execute.

    A plain class with ``find_spec`` (the meta-path protocol): importing
    ``importlib.abc`` for the base class would cost most of activation's time.
    """

    def find_spec(self, fullname, path, target=None):  # noqa: ANN001
        if fullname not in _TARGETS:
            return None
        # Find the real spec with the rest of the meta path (skip ourselves).
        for finder in sys.meta_path:
            if finder is self:
                continue
            spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
            if spec is not None and spec.loader is not None:
                spec.loader = _PatchingLoader(spec.loader, _TARGETS[fullname])
                return spec
        return None


class _PatchingLoader:
    def __init__(self, inner, patch_name: str) -> None:  # noqa: ANN001
        self._inner = inner
        self._patch = patch_name

    def create_module(self, spec):  # noqa: ANN001
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:  # noqa: ANN001
        self._inner.exec_module(module)
        from . import _diagnose

        getattr(_diagnose, self._patch)(module)


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
    if any(isinstance(f, _PostImportFinder) for f in sys.meta_path):
        return
    for name, patch in _TARGETS.items():
        if name in sys.modules:  # already imported: patch in place
            from . import _diagnose

            getattr(_diagnose, patch)(sys.modules[name])
    sys.meta_path.insert(0, _PostImportFinder())
