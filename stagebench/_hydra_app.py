"""Alias: ``multirun.yaml`` files written before the sub-packages name this module's callback as their ``_target_``."""

from stagebench.sweep._app import SweepCallback as SweepCallback
