"""TurboVAE's SeedVR2 decode vs the ORIGINAL SeedVR code, same weights, same input, interleaved runs.

    python -m turbovae.bench.seedvr2_original --original /path/to/SeedVR [--repeat 3] [--out FILE]

Why outside the default bench: the original code (ByteDance-Seed/SeedVR, `models/video_vae_v3`) is not
ours to ship, so it is imported from a checkout the user names; nothing of it is in this repository. It is
configured as its inference scripts configure it (configs_3b/main.yaml: causal slicing with split size 4,
memory device "same", conv and norm memory limits 0.5 GiB), in fp32 on the CPU, and both sides decode the
same raw latents with the same seeded random weights (the 250 keys are the same names). TurboVAE runs the
public `TurboVAE.decode` with its default temporal slice, i.e. what a user gets.

Timing: the two sides alternate (original, ours, original, ours, ...) so load on a shared machine hits
both alike; each side's minimum is reported with every run's time in the note. Peak memory: one call per
side after the warm-up, the process's peak-RSS increase (`bench.main.PeakMemory`), reported beside the time.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Optional, Sequence

import torch

from ..vae.loader import load_checkpoint
from .common import BenchRow, format_table, interleaved_ms, write_json
from .main import PeakMemory
from .seedvr2 import random_weights

SECTION = "seedvr2-original"
CONFIG = "models/video_vae_v3/s8_c16_t4_inflation_sd3.yaml"
# configs_3b/main.yaml `vae.slicing` and `vae.memory_limit`, as the inference scripts apply them.
SLICING = {"split_size": 4, "memory_device": "same"}
MEMORY_LIMIT = {"conv_max_mem": 0.5, "norm_max_mem": 0.5}
CASES = {  # name -> latent shape
    "image decode 256²": (1, 16, 1, 32, 32),
    "5-frame decode 128²": (1, 16, 2, 16, 16),
    "9-frame decode 128²": (1, 16, 3, 16, 16),
    "21-frame decode 128²": (1, 16, 6, 16, 16),
    "5-frame decode 256²": (1, 16, 2, 32, 32),
}


class OriginalUnavailable(RuntimeError):
    """The named checkout cannot be imported (wrong path, missing dependency)."""


def build_original(checkout: Path, state_dict: dict) -> torch.nn.Module:
    """The original VideoAutoencoderKLWrapper from the checkout's yaml, with `state_dict` loaded strictly."""
    config = checkout / CONFIG
    if not config.is_file():
        raise OriginalUnavailable(f"{config} not found: --original must name a SeedVR checkout")
    try:
        import yaml
    except ImportError:
        raise OriginalUnavailable("PyYAML is needed to read the original config: pip install pyyaml") from None
    args = {k: v for k, v in yaml.safe_load(config.read_text()).items() if not k.startswith("__")}
    args.setdefault("freeze_encoder", False)  # configs_3b/main.yaml adds it to the model yaml
    sys.path.insert(0, str(checkout))
    try:
        from models.video_vae_v3.modules.attn_video_vae import VideoAutoencoderKLWrapper
    except ImportError as exc:
        raise OriginalUnavailable(f"cannot import the original VAE from {checkout}: {exc}") from exc
    finally:
        sys.path.remove(str(checkout))
    _single_process_group()  # the original asks torch.distributed for its rank, as under its torchrun script
    vae = VideoAutoencoderKLWrapper(**args).eval().requires_grad_(False)
    vae.load_state_dict(state_dict, strict=True)
    vae.set_causal_slicing(**SLICING)
    vae.set_memory_limit(**MEMORY_LIMIT)
    return vae


def _single_process_group() -> None:
    import socket

    import torch.distributed as dist

    if dist.is_initialized():
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)


def compare(checkout: Path, cases: Sequence[str], repeat: int = 3) -> list[BenchRow]:
    sd = random_weights()
    original = build_original(checkout, sd)
    ours = load_checkpoint(sd, device="cpu", dtype="fp32")
    del sd
    rows = []
    peak = PeakMemory(torch.device("cpu"))  # one measured call per side after its warm-up (peak-RSS increase)
    g = torch.Generator().manual_seed(0)
    for name in cases:
        z = torch.randn(CASES[name], generator=g)

        def theirs() -> torch.Tensor:
            with torch.inference_mode():
                out = original.decode(z).sample.clamp(-1, 1)
            return out.unsqueeze(2) if out.ndim == 4 else out  # the original squeezes a single frame

        def mine() -> torch.Tensor:
            return ours.decode(z)

        theirs(), mine()  # warm-up: first-call allocations and lazy init on both sides
        peak_theirs, _ = peak(theirs)
        peak_ours, _ = peak(mine)
        (t_theirs, t_ours), (ref, out) = interleaved_ms([theirs, mine], "cpu", repeat)
        rel = ((out - ref).abs().max() / ref.abs().max()).item()
        base = min(t_theirs)
        runs = lambda ts: "/".join(f"{t / 1e3:.2f}" for t in ts)  # noqa: E731
        rows.append(BenchRow(SECTION, name, "original SeedVR (slicing 4, limits 0.5/0.5 GiB)", base, base,
                             peak_mb=peak_theirs, note=f"fp32; runs s: {runs(t_theirs)}"))
        rows.append(BenchRow(SECTION, name, "turbovae decode (default slice)", min(t_ours), base, max_abs_err=rel,
                             peak_mb=peak_ours, note=f"fp32; max err is relative to max |ref|; runs s: {runs(t_ours)}"))
        print(format_table(rows[-2:]), flush=True)
    return rows


def main(argv: Optional[Sequence[str]] = None) -> int:
    p = argparse.ArgumentParser(prog="python -m turbovae.bench.seedvr2_original", description=__doc__.split("\n\n")[0])
    p.add_argument("--original", required=True, help="path of a SeedVR checkout (ByteDance-Seed/SeedVR)")
    p.add_argument("--cases", default=",".join(CASES), help=f"comma list of: {', '.join(CASES)}")
    p.add_argument("--repeat", type=int, default=3, help="timed runs per side, interleaved (default 3)")
    p.add_argument("--threads", type=int, default=0, help="torch CPU threads (default: torch's choice)")
    p.add_argument("--out", default="bench_results/seedvr2_original.json")
    args = p.parse_args(argv)
    if args.threads:
        torch.set_num_threads(args.threads)
    cases = [c.strip() for c in args.cases.split(",") if c.strip()]
    unknown = [c for c in cases if c not in CASES]
    if unknown:
        print(f"unknown case(s) {unknown}; choose from {', '.join(CASES)}", file=sys.stderr)
        return 2
    try:
        rows = compare(Path(args.original), cases, args.repeat)
    except OriginalUnavailable as exc:
        print(f"seedvr2-original: {exc}", file=sys.stderr)
        return 2
    write_json(rows, Path(args.out))
    print(f"\n{format_table(rows)}\nwrote {args.out}")
    return 0


if __name__ == "__main__":  # pragma: no cover
    raise SystemExit(main())
