"""Deprecated alias (turbovae-deprecated-alias): this package moved to `vae.accel.kernels`; import it from there.
Importing this package or any module under it warns and gives the moved module itself
(vae/deprecation.py)."""

from ..deprecation import alias_package

alias_package(__name__, __name__.rsplit(".", 2)[0] + ".vae.accel.kernels")
