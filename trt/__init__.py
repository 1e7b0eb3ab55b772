"""Deprecated alias (turbovae-deprecated-alias): this package moved to `engines`; import it from there.
Importing this package or any module under it warns and gives the moved module itself
(vae/deprecation.py)."""

from ..vae.deprecation import alias_package

alias_package(__name__, __name__.rsplit(".", 1)[0] + ".engines")
