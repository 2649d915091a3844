"""Rounds in turns: the one order every comparison of settings runs them in (docs/method.md#rounds-in-turns)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TypeVar

__all__ = ["in_turns"]

T = TypeVar("T")


def in_turns(
    settings: Callable[[int], Sequence[T]], max_rounds: int, *, start: int = 0, there_and_back: int = 0
) -> Iterator[tuple[int, list[T]]]:
    """The rounds of a comparison in turns: yields each round's number (``start`` + i) and its order.

    ``settings(i)`` is asked before round ``i`` (from 0, once the rounds before it ran) for the settings
    it runs; none ends the rounds (settled, or stopped), as ``max_rounds`` does. The first
    ``there_and_back`` rounds run them forth and back (A B B A), the others forth, then back every other
    round (A B, then B A).
    """
    for i in range(max_rounds):
        todo = list(settings(i))
        if not todo:
            return
        yield start + i, todo + todo[::-1] if i < there_and_back else todo[::-1] if i % 2 else todo
