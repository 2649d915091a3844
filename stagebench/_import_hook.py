"""Run a callback right after a module is imported, without importing it now.

Used by diagnostic mode's activation (SPDL's ``_profile`` module) and by the
DataLoader hook (``torch.utils.data.dataloader``). It imports nothing of
stagebench's: :mod:`stagebench._activate` loads it at every interpreter start
while the mode is on.
"""

from __future__ import annotations

import sys

__all__ = ["PostImportFinder"]


class PostImportFinder:
    """Calls ``on_import(module)`` right after any of ``targets`` is executed.

    Patching on import (rather than importing the target now) keeps start-up
    fast and lets processes that never import it pay nothing. A plain class with
    ``find_spec`` (the meta-path protocol): importing ``importlib.abc`` for the
    base class would cost most of activation's time. Also used by the DataLoader
    hook (``_loader_intercept``).
    """

    def __init__(self, targets, on_import) -> None:
        self.targets = frozenset(targets)
        self.on_import = on_import
        self._finding: set = set()

    def find_spec(self, fullname, path, target=None):
        # A name being found already (another finder of this kind asked the meta path, which holds this
        # one): not ours to find again, or two such finders would ask each other for ever.
        if fullname not in self.targets or fullname in self._finding:
            return None
        self._finding.add(fullname)
        try:
            # Find the real spec with the rest of the meta path (skip ourselves).
            for finder in sys.meta_path:
                if finder is self:
                    continue
                spec = getattr(finder, "find_spec", lambda *a: None)(fullname, path, target)
                if spec is not None and spec.loader is not None:
                    spec.loader = _PatchingLoader(spec.loader, self.on_import)
                    return spec
            return None
        finally:
            self._finding.discard(fullname)


class _PatchingLoader:
    def __init__(self, inner, on_import) -> None:
        self._inner = inner
        self._on_import = on_import

    def create_module(self, spec):
        return self._inner.create_module(spec)

    def exec_module(self, module) -> None:
        self._inner.exec_module(module)
        self._on_import(module)
