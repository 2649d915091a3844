"""``python -m stagebench`` is the ``stagebench`` command."""

from stagebench._cli import console

console()
