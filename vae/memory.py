"""Deprecated alias (turbovae-deprecated-alias): this module moved to `vae.free_memory`; import it from there.
Importing this path warns and gives that module itself (vae/deprecation.py)."""

from .deprecation import alias_module

alias_module(__name__, __name__.rsplit(".", 2)[0] + ".vae.free_memory")
