"""The causal state a pass carries between layers and slices, as an interface: what `vae/base.py`'s `CausalCache`
implements and what the compiled regions of vae/accel/compile.py snapshot and restore. It stands alone, below
both, so the acceleration code needs nothing of the model contract."""

from __future__ import annotations

from abc import ABC, abstractmethod


class CausalState(ABC):
    """What a pass carries from layer to layer and slice to slice (causal caches read and written)
    and may advance in any layer call.

    Why: a layer run that fails part-way (a compiled region whose later sub-graph fails after an earlier
    one advanced the cache) must be re-run from the state it started from, or that slice reads the wrong
    history and comes out silently wrong. `snapshot` is cheap (references, not copies: the architectures
    replace cache entries, they never write into them).
    """

    @abstractmethod
    def snapshot(self) -> object:
        """An opaque record of the current state."""

    @abstractmethod
    def restore(self, saved: object) -> None:
        """Back to the state `snapshot` recorded."""
