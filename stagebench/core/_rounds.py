"""Rounds in turns: the one order every comparison of settings runs them in (docs/method.md#rounds-in-turns)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["in_turns"]

T = TypeVar("T")


def in_turns(
    settings: Callable[[int], Sequence[T]], max_rounds: int, *, start: int = 0, there_and_back: int = 0
) -> Iterator[tuple[int, list[T]]]:
    """Each round's number (``start`` + i) and its settings in the order to run them: ``settings(i)``, asked
    once the rounds before it ran (none ends the rounds, as ``max_rounds`` does), forth and back (A B B A)
    in the first ``there_and_back`` rounds, else forth, then back every other round (A B, then B A)."""
    for i in range(max_rounds):
        todo = list(settings(i))
        if not todo:
            return
        yield start + i, todo + todo[::-1] if i < there_and_back else todo[::-1] if i % 2 else todo
