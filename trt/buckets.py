"""The one bucket/profile table shared by engine build and engine run.

Build writes the table into every engine's identity sidecar and run reads it back from there, so the
two can never disagree (the LightX2V defect where build and run tables differed). All sizes are
pixels, multiples of `MULTIPLE` (16: Qwen-Image/Wan pipelines pack 2x2 latents; SeedVR2 needs 8).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Iterable, Optional, Sequence

import torch
import torch.nn.functional as F

log = logging.getLogger(__name__)

MULTIPLE = 16
MODES = ("static", "multi_ratio", "multi_profile")


@dataclass(frozen=True)
class Bucket:
    """One static engine shape, in pixels."""

    height: int
    width: int

    @property
    def name(self) -> str:
        return f"{self.width}x{self.height}"

    @property
    def area(self) -> int:
        return self.height * self.width

    def contains(self, height: int, width: int) -> bool:
        return height <= self.height and width <= self.width

    @classmethod
    def parse(cls, text: str) -> "Bucket":
        """'WxH' (width first, like image editors and the CLI)."""
        try:
            w, h = (int(v) for v in text.lower().split("x"))
        except ValueError:
            raise ValueError(f"bucket {text!r} is not WIDTHxHEIGHT (e.g. 1024x1024)") from None
        return cls(h, w)


@dataclass(frozen=True)
class Profile:
    """A dynamic-shape range (min/opt/max, pixels) served by one optimization profile."""

    name: str
    min_hw: tuple[int, int]
    opt_hw: tuple[int, int]
    max_hw: tuple[int, int]

    @property
    def max_area(self) -> int:
        return self.max_hw[0] * self.max_hw[1]

    def contains(self, height: int, width: int) -> bool:
        return (self.min_hw[0] <= height <= self.max_hw[0]) and (self.min_hw[1] <= width <= self.max_hw[1])


@dataclass(frozen=True)
class Selection:
    """Where an input of `request` (h, w) pixels runs: a bucket (padded to `padded`) or a profile."""

    index: int
    request: tuple[int, int]
    padded: tuple[int, int]
    label: str

    @property
    def exact(self) -> bool:
        return self.request == self.padded


@dataclass(frozen=True)
class BucketTable:
    """Static buckets or dynamic profiles; `validate()` enforces the shared rules."""

    mode: str
    buckets: tuple[Bucket, ...] = ()
    profiles: tuple[Profile, ...] = ()
    multiple: int = MULTIPLE

    def __post_init__(self) -> None:
        self.validate()

    def validate(self) -> None:
        if self.mode not in MODES:
            raise ValueError(f"unknown engine set mode {self.mode!r}; use one of {', '.join(MODES)}")
        m = self.multiple
        if not isinstance(m, int) or m <= 0:
            raise ValueError(f"table multiple must be a positive integer, got {m!r}")

        def check(hw: Sequence[int], what: str) -> None:
            if len(hw) != 2 or not all(isinstance(v, int) for v in hw):
                raise ValueError(f"{what} {hw!r}: need two integer sizes (height, width)")
            if any(v <= 0 or v % m for v in hw):
                raise ValueError(f"{what} {hw[1]}x{hw[0]} (WxH): sizes must be positive multiples of {m} px")

        if self.mode == "multi_profile":
            if not self.profiles or self.buckets:
                raise ValueError("a multi_profile table needs profiles and no static buckets")
            seen = set()
            for p in self.profiles:
                for hw in (p.min_hw, p.opt_hw, p.max_hw):
                    check(hw, f"profile {p.name!r} size")
                if not all(a <= b <= c for a, b, c in zip(p.min_hw, p.opt_hw, p.max_hw)):
                    raise ValueError(f"profile {p.name!r}: need min <= opt <= max in both dims")
                key = (p.min_hw, p.max_hw)
                if key in seen:
                    raise ValueError(f"profile {p.name!r} repeats another profile's range; ranges must differ")
                seen.add(key)
        else:
            if not self.buckets or self.profiles:
                raise ValueError(f"a {self.mode} table needs static buckets and no profiles")
            if self.mode == "static" and len(self.buckets) != 1:
                raise ValueError("a static table has exactly one bucket; use multi_ratio for several")
            for b in self.buckets:
                check((b.height, b.width), "bucket")
            if len(set(self.buckets)) != len(self.buckets):
                raise ValueError("bucket table lists a size twice")

    @property
    def size(self) -> int:
        """Number of entries (profiles or buckets)."""
        return len(self.profiles) if self.mode == "multi_profile" else len(self.buckets)

    # -- choice --------------------------------------------------------------------------------
    def choose(self, height: int, width: int) -> Optional[Selection]:
        """The entry an input of (height, width) pixels runs on, or None when nothing contains it.

        Buckets: the smallest area that contains the input (never a crop or a resize); ties go to
        the smaller overshoot max(H-h, W-w), then to the smaller (H, W). Profiles: the one with the
        smallest max area whose range contains the input rounded up to the multiple, so every input
        belongs to exactly one profile. The choice is logged.
        """
        if self.mode == "multi_profile":
            m = self.multiple
            ph, pw = -(-height // m) * m, -(-width // m) * m
            hits = [(p.max_area, i) for i, p in enumerate(self.profiles) if p.contains(ph, pw)]
            if not hits:
                return None
            _, i = min(hits)
            sel = Selection(i, (height, width), (ph, pw), f"profile {self.profiles[i].name}")
        else:
            hits = [(b.area, max(b.height - height, b.width - width), b.height, b.width, i)
                    for i, b in enumerate(self.buckets) if b.contains(height, width)]
            if not hits:
                return None
            i = min(hits)[-1]
            b = self.buckets[i]
            sel = Selection(i, (height, width), (b.height, b.width), f"bucket {b.name}")
        log.debug("engine set: %dx%d (WxH) -> %s%s", width, height, sel.label,
                  "" if sel.exact else f" (padded to {sel.padded[1]}x{sel.padded[0]})")
        return sel

    def describe(self) -> str:
        if self.mode == "multi_profile":
            return ", ".join(f"{p.name}: {p.min_hw[1]}x{p.min_hw[0]}..{p.max_hw[1]}x{p.max_hw[0]} "
                             f"(opt {p.opt_hw[1]}x{p.opt_hw[0]})" for p in self.profiles)
        return ", ".join(b.name for b in self.buckets)

    # -- JSON ----------------------------------------------------------------------------------
    def to_json(self) -> dict:
        return {"mode": self.mode, "multiple": self.multiple,
                "buckets": [[b.height, b.width] for b in self.buckets],
                "profiles": [{"name": p.name, "min": list(p.min_hw), "opt": list(p.opt_hw), "max": list(p.max_hw)}
                             for p in self.profiles]}

    @classmethod
    def from_json(cls, data: dict) -> "BucketTable":
        """The table `to_json` wrote; KeyError/TypeError/ValueError for anything else (callers reading
        files turn those into their own typed error)."""
        return cls(mode=data["mode"], multiple=data.get("multiple", MULTIPLE),
                   buckets=tuple(Bucket(*_pair(hw)) for hw in data.get("buckets", ())),
                   profiles=tuple(Profile(str(p["name"]), _pair(p["min"]), _pair(p["opt"]), _pair(p["max"]))
                                  for p in data.get("profiles", ())))


def _pair(values) -> tuple[int, int]:
    h, w = values
    if not all(isinstance(v, int) and not isinstance(v, bool) for v in (h, w)):
        raise TypeError(f"sizes must be integers, got {values!r}")
    return h, w


# Qwen-Image's trained aspect ratios at ~1.6 MP plus the common 1024²/512², all multiples of 16 (H, W).
DEFAULT_MULTI_RATIO = (Bucket(512, 512), Bucket(1024, 1024), Bucket(1328, 1328), Bucket(928, 1664),
                       Bucket(1664, 928), Bucket(1104, 1472), Bucket(1472, 1104), Bucket(1056, 1584),
                       Bucket(1584, 1056))
# Few profiles with different ranges; an input goes to the smallest range containing it (≤1 MP, ≤2.8 MP, ≤4 MP).
DEFAULT_PROFILES = (Profile("le1mp", (256, 256), (1024, 1024), (1024, 1024)),
                    Profile("le2.8mp", (256, 256), (1328, 1328), (1664, 1664)),
                    Profile("le4mp", (256, 256), (1088, 1920), (2048, 2048)))


def static_table(bucket: Bucket, multiple: int = MULTIPLE) -> BucketTable:
    return BucketTable("static", buckets=(bucket,), multiple=multiple)


def multi_ratio_table(buckets: Iterable[Bucket] = DEFAULT_MULTI_RATIO, multiple: int = MULTIPLE) -> BucketTable:
    return BucketTable("multi_ratio", buckets=tuple(buckets), multiple=multiple)


def multi_profile_table(profiles: Iterable[Profile] = DEFAULT_PROFILES, multiple: int = MULTIPLE) -> BucketTable:
    return BucketTable("multi_profile", profiles=tuple(profiles), multiple=multiple)


# -- geometry: pad instead of crop, crop the output back -----------------------------------------
def pad_to(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    """Replicate-pad the last two dims (bottom/right) of a 4-D tensor up to (height, width)."""
    h, w = x.shape[-2:]
    if (h, w) == (height, width):
        return x
    if h > height or w > width:
        raise ValueError(f"cannot pad {w}x{h} down to {width}x{height}")
    return F.pad(x, (0, width - w, 0, height - h), mode="replicate")


def crop_to(x: torch.Tensor, height: int, width: int) -> torch.Tensor:
    return x[..., :height, :width]
