"""Reading the model's types from the dicts ``run.json`` and ``summary.json`` hold, and writing them back.

Every type of :mod:`stagebench.model` is a frozen dataclass read from a dict (``from_json``) and written
back to one (``to_json``). The coercions a value goes through on the way in (a number kept as written, a
count, a text, a flag, a mapping, a list of them) and the copying of fields by name are here, once, so
that each type states only what is its own: a default that differs, a coercion, a key order of its own.

:func:`read` fills a type's fields from the keys of the same names. What :func:`write` gives back depends
on what the type keeps of the dict it was read from:

* ``keys`` and ``extra`` fields (all the dict's keys in order, and those the type does not name): the
  dict rebuilt from them, each field's value in its key's place, the unknown keys as read;
* a ``_json`` field (the dict itself): a copy of it;
* neither: every field, in the order the type declares them, but those named in its ``OPTIONAL``
  (written only where they hold something: not None, or where the field its ``BESIDE`` names does).

Nested values are written as JSON holds them: a type by its ``to_json``, a tuple as a list, a mapping as
a dict. So run.json and summary.json do not change by being read.

A type whose ``from_json`` is :func:`read` with a coercion per field subclasses :class:`Read` (or
:class:`ReadIfGiven`, where a dict that holds nothing reads as None) and states the coercions in its
``READ`` table: its ``from_json`` and ``to_json`` are then not written by hand.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from collections.abc import Callable, Mapping, Sequence
from typing import Any, ClassVar, TypeVar

__all__ = [
    "Written",
    "Read",
    "ReadIfGiven",
    "Coercions",
    "given",
    "filled",
    "number",
    "integer",
    "whole",
    "text",
    "flag",
    "mapping",
    "maps",
    "record",
    "records",
    "items",
    "texts",
    "dict_of",
    "each",
    "nums",
    "span",
    "read",
    "write",
]

_T = TypeVar("_T")
_R = TypeVar("_R", bound="Read")
_G = TypeVar("_G", bound="ReadIfGiven")

#: the fields that keep what was read rather than a fact: never read or written by name
_KEPT = frozenset({"keys", "extra", "_json"})


def number(v: Any) -> float | None:
    """``v`` as read where it is a number (an int stays an int, NaN stays NaN; not a bool), else None."""
    if isinstance(v, bool) or not isinstance(v, numbers.Real):
        return None
    return v  # type: ignore[return-value]  # a Real is an int or a float here (numpy's scalars included)


def integer(v: Any) -> int | None:
    """``v`` where it is written as an int (not a bool, not a float), else None."""
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def whole(v: Any) -> int | None:
    """A count: ``v`` as an int where it is a finite number (``4.0`` is 4), else None."""
    x = number(v)
    return int(x) if x is not None and math.isfinite(x) else None


def text(v: Any) -> str | None:
    return None if v is None else str(v)


def flag(v: Any) -> bool | None:
    return v if isinstance(v, bool) else None


def mapping(v: Any) -> Mapping[str, Any] | None:
    """``v`` where it is a mapping (the same object), else None."""
    return v if isinstance(v, Mapping) else None


def given(from_json: Callable[[Mapping[str, Any]], _T]) -> Callable[[Any], _T | None]:
    """A reader of a nested record: ``from_json`` of it where it is a mapping, else None.

    Args:
        from_json: the nested type's reader.

    Returns:
        A coercion for a ``READ`` table or :func:`read`.
    """
    return lambda v: from_json(v) if isinstance(v, Mapping) else None


def filled(from_json: Callable[[Mapping[str, Any]], _T]) -> Callable[[Any], _T | None]:
    """As :func:`given`, where an empty mapping is none either (a record copied only where it holds something)."""
    return lambda v: from_json(v) if isinstance(v, Mapping) and v else None


def _listed(v: Any) -> bool:
    return isinstance(v, Sequence) and not isinstance(v, str)


def maps(v: Any) -> tuple[Mapping[str, Any], ...]:
    """The mappings of a list, () where it is no list."""
    return tuple(x for x in v if isinstance(x, Mapping)) if _listed(v) else ()


def record(v: Any) -> dict[str, Any] | None:
    """A record other types read, as the JSON holds it (the same dict); None where there is none."""
    return v if isinstance(v, dict) else dict(v) if isinstance(v, Mapping) else None


def records(v: Any) -> tuple[dict[str, Any], ...]:
    """The records of a list or tuple (see :func:`record`), () where it is neither."""
    return tuple(r for r in (record(x) for x in v) if r is not None) if isinstance(v, (list, tuple)) else ()


def items(v: Any) -> tuple[Any, ...]:
    """A list as a tuple, as written; () where it is empty or None."""
    return tuple(v or ())


def texts(v: Any) -> tuple[str, ...]:
    """A list's items as texts; () where it is empty or None."""
    return tuple(str(x) for x in v or ())


def dict_of(v: Any) -> dict[str, Any]:
    """A mapping as a new dict; {} where it is empty or None."""
    return dict(v or {})


def each(read_one: Callable[[Any], _T]) -> Callable[[Any], tuple[_T, ...]]:
    """A reader of a list, each item read by ``read_one``; () where it is empty or None."""
    return lambda v: tuple(read_one(x) for x in v or ())


def nums(v: Any) -> tuple[float, ...]:
    """The numbers of a list as written (the readers filter them), () where it is no list."""
    return tuple(v) if _listed(v) else ()


def span(v: Any) -> tuple[float, ...] | None:
    """A range (``[low, high]``) as floats, None where it is no list."""
    return tuple(float(x) for x in v) if _listed(v) else None


def _names(cls: Any) -> list[str]:
    """``cls``'s fields that hold facts, in their order."""
    return [f.name for f in dataclasses.fields(cls) if f.name not in _KEPT]


def _kept(cls: Any) -> set[str]:
    """What ``cls`` keeps of the dict it was read from (``keys``, ``extra``, ``_json``)."""
    return {f.name for f in dataclasses.fields(cls)} & _KEPT


def read(
    cls: type[_T],
    d: Mapping[str, Any] | None,
    values: Mapping[str, Any] | None = None,
    /,
    **convert: Callable[[Any], Any],
) -> _T:
    """A ``cls`` from ``d`` (a dict as the JSON holds it; anything else reads as empty).

    Each field takes the value of the key of its name, through ``convert[name]`` where given; a key ``d``
    lacks leaves the field's default. ``values`` (by position) sets fields outright (a value made from other keys, or
    from the whole dict). Where ``cls`` has them, ``keys`` gets all of ``d``'s keys in order, ``extra``
    those it does not name, and ``_json`` a copy of ``d``.
    """
    d = d if isinstance(d, Mapping) else {}
    names = _names(cls)
    kw: dict[str, Any] = {k: convert[k](d[k]) if k in convert else d[k] for k in names if k in d}
    kw.update(values or {})
    kept = _kept(cls)
    if "keys" in kept:
        kw["keys"] = tuple(str(k) for k in d)
    if "extra" in kept:
        known = set(names)
        kw["extra"] = {k: v for k, v in d.items() if k not in known}
    if "_json" in kept:
        kw["_json"] = dict(d)
    return cls(**kw)


def _out(v: Any) -> Any:
    """``v`` as JSON holds it: a type by its ``to_json``, a tuple as a list, a mapping as a dict."""
    if hasattr(v, "to_json"):
        return v.to_json()
    if isinstance(v, (list, tuple)):
        return [_out(x) for x in v]
    if isinstance(v, Mapping):
        return {k: _out(x) for k, x in v.items()}
    return v


def write(obj: Any) -> dict[str, Any]:
    """``obj`` (a dataclass of this package) as the dict it was read from (module docstring)."""
    if hasattr(obj, "_json"):
        return dict(obj._json)
    if hasattr(obj, "keys"):
        return {k: obj.extra[k] if k in obj.extra else _out(getattr(obj, k)) for k in obj.keys}
    optional: frozenset[str] = getattr(obj, "OPTIONAL", frozenset())
    beside: Mapping[str, str] = getattr(obj, "BESIDE", {})
    values = {k: getattr(obj, k) for k in _names(type(obj))}
    return {
        k: _out(v)
        for k, v in values.items()
        if v is not None or k not in optional or values[beside.get(k, k)] is not None
    }


class Written:
    """The ``to_json`` of a type written back by :func:`write` (most of this package's): a base that holds
    no field of its own, so a frozen, slotted dataclass keeps its layout."""

    __slots__ = ()

    #: the fields :func:`write` writes only where they hold something (not None)
    OPTIONAL: ClassVar[frozenset[str]] = frozenset()
    #: an optional field written where the field named here holds something too (the keys of a group)
    BESIDE: ClassVar[Mapping[str, str]] = {}

    def to_json(self) -> dict[str, Any]:
        """The dict it was read from (module docstring)."""
        return write(self)


#: a type's coercions on the way in, by field name (see :func:`read`); a field not named is taken as written
Coercions = Mapping[str, Callable[[Any], Any]]


class Read(Written):
    """A type read by :func:`read` with the coercions of its ``READ`` table and written back by
    :func:`write`: ``from_json`` and ``to_json`` are stated once, here, for every such type."""

    __slots__ = ()

    READ: ClassVar[Coercions] = {}

    @classmethod
    def from_json(cls: type[_R], d: Mapping[str, Any] | None) -> _R:
        """A ``cls`` from ``d`` as the JSON holds it (anything but a mapping reads as empty)."""
        return read(cls, d, **cls.READ)


class ReadIfGiven(Written):
    """As :class:`Read`, for a record that may be absent: a dict that holds nothing (see :meth:`holds`)
    reads as None, so a reader tells "not recorded" from a record of defaults."""

    __slots__ = ()

    READ: ClassVar[Coercions] = {}

    @classmethod
    def holds(cls, d: Mapping[str, Any]) -> bool:
        """Whether ``d`` is a record of this type: not empty (a type states its own test)."""
        return bool(d)

    @classmethod
    def from_json(cls: type[_G], d: Mapping[str, Any] | None) -> _G | None:
        """A ``cls`` from ``d``; None where ``d`` is no mapping or holds no record."""
        if not isinstance(d, Mapping) or not cls.holds(d):
            return None
        return read(cls, d, **cls.READ)
