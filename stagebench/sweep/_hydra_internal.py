"""The one place that touches Hydra's private API (``hydra._internal``).

Hydra has no public way to build its argument parser, its config loader over
``@hydra.main``'s search path, or the basic sweeper's job list; ``stagebench
sweep`` needs all three to check a command before any job starts. Hydra is
pinned below 1.4 in ``pyproject.toml``; a Hydra upgrade is checked here.
"""

from __future__ import annotations

from typing import Any

from hydra._internal.config_loader_impl import ConfigLoaderImpl
from hydra._internal.core_plugins.basic_sweeper import BasicSweeper
from hydra._internal.utils import create_config_search_path, get_args_parser

__all__ = ["args_parser", "config_search_path", "config_loader", "split_sweep"]


def args_parser() -> Any:
    """``@hydra.main``'s own argument parser."""
    return get_args_parser()


def config_search_path(primary_dir: str) -> Any:
    """The search path ``@hydra.main`` builds around a primary config folder."""
    return create_config_search_path(primary_dir)


def config_loader(search_path: Any) -> Any:
    """Hydra's config loader over ``search_path``."""
    return ConfigLoaderImpl(config_search_path=search_path)


def split_sweep(parsed: list) -> list[list[str]]:
    """The override lists of the jobs the basic sweeper makes of parsed overrides (their product)."""
    return [list(c) for c in BasicSweeper.split_arguments(parsed, None)[0]]
