"""stagebench's Hydra configs (``stagebench sweep``).

Installed from a wheel this folder is ``stagebench/conf``; the file makes it
importable so other Hydra apps can add it to their search path as
``pkg://stagebench.conf``. stagebench itself reads it as a folder.
"""
