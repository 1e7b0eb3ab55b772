"""Package discovery for `turbovae`.

The repository root is the package itself (it is also the ComfyUI custom-node folder, which ComfyUI
imports under any name), so the sub-packages are found under "." and renamed into `turbovae.*`.
pyproject.toml holds everything else; a hand-written list here once missed a sub-package, and a plain
`pip install .` then failed on import.
"""

from setuptools import find_packages, setup

NOT_PACKAGES = ["tests", "tests.*", "scripts", "scripts.*", "build", "build.*", "dist", "dist.*"]

setup(packages=["turbovae", *(f"turbovae.{name}" for name in find_packages(".", exclude=NOT_PACKAGES))])
