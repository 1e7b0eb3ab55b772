"""Deprecated alias (turbovae-deprecated-alias): this module moved to `vae.tiled`; import it from there.
Importing this path warns and gives that module itself (vae/deprecation.py)."""

from ..deprecation import alias_module

alias_module(__name__, __name__.rsplit(".", 3)[0] + ".vae.tiled")
