"""``python -m stagebench`` is the ``stagebench`` command."""

from ._cli import console

console()
