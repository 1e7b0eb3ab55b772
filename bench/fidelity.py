"""Fidelity at real sizes and real activation statistics: each architecture's fp32 passes against a float64 run of
the same model.

Why a section of its own: the equality tests at 64² with fan-in weights see activations near zero mean, where
one-pass norm statistics are harmless; a released checkpoint's deeper activations have large means, and a
channels-last CPU GroupNorm that summed x and x² lost 18x accuracy there with every test green. Here the
weights are the real architectures at real configs, seeded, with the convolution biases shifted so the norm
inputs carry a mean of `bias_shift` and more (the largest |mean| / std a norm saw is recorded per case), and
every fast path runs alone as well as all together. `--init reference` runs the weights the reference code's own
constructors make instead (bench/reference_init.py; with `--bias-shift 0`, the weights as they are): a kernel's
summation order costs more there than on the fan-in weights, and the fast paths are held to the plain path on both.

    python -m turbovae.bench.fidelity --out docs/results/<date>-cpu-fidelity.json [--cases seedvr2] [--init reference]
    python -m turbovae.bench.fidelity --markdown docs/results/<date>-cpu-fidelity.json   # the docs table
    python -m turbovae.bench.fidelity --markdown docs/results/<date>-cpu-fidelity.json --paths   # the paths table

Errors are max abs / the float64 output's range. The float64 side runs the default paths: each is exact in
exact arithmetic, and each is also compared alone with the plain path in fp32 (`alone_vs_plain`).
"""

from __future__ import annotations

import argparse
import copy
import json
import statistics
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Callable, Optional, Sequence

import torch

from ..trt.fileio import atomic_write_text
from ..vae.accel.channels_last import channels_last_in_cpu_fp32
from ..vae.accel.switches import FastPaths
from ..vae.norms import native_channels_last_group_norm, observing_norm_inputs, timing_group_norms
from .common import environment, interleaved_ms
from ..vae.seeded_weights import fan_in_weights
from .cases import FidelityCase, for_section
from .reference_init import reference_init_weights

# Biases of the convolutions whose output is the pass's output: shifting them would shift the pixels (clamped)
# or the latents, not the activations a norm sees.
_OUTPUT_CONVS = ("conv_out", "quant_conv")


INITS = ("fan_in", "reference")  # `vae.seeded_weights.fan_in_weights`; bench/reference_init.py


def shifted_activation_weights(shapes: dict, bias_shift: float, seed: int = 0) -> dict[str, torch.Tensor]:
    """`fan_in_weights` with every inner convolution's bias moved by ±`bias_shift` (one seeded sign per layer),
    so the activations after it, and the norms reading them, have a mean of that size against an O(1) spread."""
    return shift_biases(fan_in_weights(shapes, seed), shapes, bias_shift, seed)


def shift_biases(sd: dict[str, torch.Tensor], shapes: dict, bias_shift: float,
                 seed: int = 0) -> dict[str, torch.Tensor]:
    """`sd` with every inner convolution's bias moved by ±`bias_shift` (one seeded sign per layer); `sd` itself
    when the shift is 0."""
    if not bias_shift:
        return sd
    g = torch.Generator().manual_seed(seed + 1)
    for key in sorted(sd):
        weight = key[:-len("bias")] + "weight"
        if not key.endswith(".bias") or len(shapes.get(weight, ())) < 4 or any(n in key for n in _OUTPUT_CONVS):
            continue
        sign = 1.0 if torch.rand((), generator=g).item() < 0.5 else -1.0
        sd[key] = sd[key] + sign * bias_shift
    return sd


def model_shapes(family: str) -> dict[str, tuple[int, ...]]:
    """Key -> shape of a registered family's real-config model (its key or an alias)."""
    from ..vae.registry import family as registry_family

    return {k: tuple(v.shape) for k, v in registry_family(family).meta_model(real=True).state_dict().items()}


@dataclass
class FidelityResult:
    case: str
    bias_shift: float
    max_norm_mean_over_std: float  # the largest |mean| / std of one (frame, group) a norm saw in the fp32 pass
    output_range: float
    default_vs_fp64: float
    plain_vs_fp64: float
    alone_vs_plain: dict[str, float] = field(default_factory=dict)
    alone_vs_fp64: dict[str, float] = field(default_factory=dict)
    # timed runs only: median seconds of the default path with the stable channels-last statistics and with
    # PyTorch's one-pass kernel (what ran before), of the default path without channels-last, and of the plain
    # path, alternating run by run
    default_s: Optional[float] = None
    default_native_stats_s: Optional[float] = None
    default_native_stats_vs_fp64: Optional[float] = None
    default_without_channels_last_s: Optional[float] = None  # what channels-last gains, in the same rounds
    plain_s: Optional[float] = None
    # seconds inside the GroupNorm calls of one pass (median over the rounds), default path with the stable
    # statistics and with PyTorch's: the norms' own cost, less exposed to machine noise than a whole pass
    default_group_norm_s: Optional[float] = None
    default_native_stats_group_norm_s: Optional[float] = None
    rounds_s: dict[str, list[float]] = field(default_factory=dict)  # every timed run, by variant
    init: str = "fan_in"  # the weights (INITS); files written before the option have fan-in weights
    # timed runs where the default runs contiguous because fp32 on the CPU keeps channels-last off
    # (vae/accel/channels_last.py), instead of the native-stats and without-channels-last variants: the default
    # with channels-last forced on (the kernels the default ran before that rule), its median seconds and error
    default_channels_last_s: Optional[float] = None
    default_channels_last_vs_fp64: Optional[float] = None


def photo(frames: int, height: int, width: int, seed: int = 0) -> torch.Tensor:
    """A photo-like clip in [-1, 1]: smooth colour fields, an edge, a ring, mild noise, a slow pan."""
    g = torch.Generator().manual_seed(seed)
    out = []
    for t in range(frames):
        yy, xx = torch.meshgrid(torch.linspace(-1, 1, height), torch.linspace(-1, 1, width) + 0.05 * t,
                                indexing="ij")
        img = torch.stack([0.6 * torch.sin(3 * xx + 1) * torch.cos(2 * yy),
                           0.5 * (xx * yy > 0).float() - 0.25 + 0.3 * yy,
                           0.4 * torch.tanh(5 * (xx ** 2 + yy ** 2 - 0.4))])
        out.append(img + 0.05 * torch.randn(3, height, width, generator=g))
    return torch.stack(out, dim=1).clamp_(-1, 1)[None]


class NormStatsProbe:
    """Records the largest |mean| / std over (frame, group) of the inputs the norm ops see inside a `with` block
    (`vae.norms.observing_norm_inputs`)."""

    def __init__(self) -> None:
        self.max_ratio = 0.0
        self._observing = None

    def observe(self, x: torch.Tensor, groups: int) -> None:
        frames = x.detach().double()
        if frames.ndim == 5:
            frames = frames.transpose(1, 2).reshape(-1, *frames.shape[1:2], *frames.shape[3:])
        per_group = frames.reshape(frames.shape[0], groups, -1)
        ratio = (per_group.mean(-1).abs() / per_group.std(-1).clamp_min(1e-12)).max().item()
        self.max_ratio = max(self.max_ratio, ratio)

    def __enter__(self) -> "NormStatsProbe":
        self._observing = observing_norm_inputs(self.observe)
        self._observing.__enter__()
        return self

    def __exit__(self, *exc) -> None:
        self._observing.__exit__(*exc)


def _error(out: torch.Tensor, truth: torch.Tensor, scale: float) -> float:
    return (out.double() - truth).abs().max().item() / scale


def build_models(family: str, bias_shift: float = 20.0, seed: int = 0,
                 init: str = "fan_in") -> tuple[torch.nn.Module, torch.nn.Module]:
    """(fp32, float64) real-config models of `family` with the same shifted seeded weights: what `run_case` runs.
    `init`: "fan_in" (`fan_in_weights`) or "reference" (the reference code's own initialisation,
    bench/reference_init.py); the biases are shifted by `bias_shift` on either.
    Building Wan 2.2's pair takes seconds (705 M parameters, the float64 copy 5.6 GB), so cases of one family may
    share one pair (`run_case(models=…)`); `run_case` sets the fp32 model's paths itself before every pass."""
    from ..vae.loader import load_checkpoint

    shapes = model_shapes(family)
    if init == "fan_in":
        sd = shifted_activation_weights(shapes, bias_shift, seed)
    elif init == "reference":
        sd = shift_biases(reference_init_weights(family, seed), shapes, bias_shift, seed)
    else:
        raise ValueError(f"init must be one of {', '.join(INITS)}, got {init!r}")
    m32 = load_checkpoint(sd, dtype=torch.float32, device="cpu").model
    m64 = load_checkpoint(sd, dtype=torch.float64, device="cpu").model
    return m32, m64


def run_case(case: FidelityCase, *, bias_shift: float = 20.0, paths: Optional[Sequence[str]] = None,
             repeat: int = 0, seed: int = 0, init: str = "fan_in",
             models: Optional[tuple[torch.nn.Module, torch.nn.Module]] = None) -> FidelityResult:
    """The case in float64 (default paths), fp32 default, fp32 plain and fp32 with each fast path alone
    (`paths`: those of the architecture by default; a path the pass does not take on this device and dtype is the
    plain path's run, not run again); `repeat` > 0 also times the default path against itself
    with PyTorch's channels-last GroupNorm statistics, and the plain path, alternating `repeat` rounds.
    `models`: the pair `build_models(case.family, bias_shift, seed, init)` returns, when the caller already has it
    (`init` is then only recorded)."""
    m32, m64 = models if models is not None else build_models(case.family, bias_shift, seed, init)
    m32.fast = FastPaths()
    pixels = photo(case.frames, case.height, case.width, seed)

    with torch.inference_mode():
        if case.direction == "decode":
            latents = m32.encode_moments(pixels)[:, :m32.latent_format.channels]

            def run(model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
                return model.decode_latents(latents.to(dtype))
        else:
            def run(model: torch.nn.Module, dtype: torch.dtype) -> torch.Tensor:
                return model.encode_moments(pixels.to(dtype))

        truth = run(m64, torch.float64)
        del m64
        scale = (truth.max() - truth.min()).item()

        def with_paths(fast: FastPaths) -> torch.Tensor:
            m32.fast = fast
            return run(m32, torch.float32)

        with NormStatsProbe() as probe:
            default = with_paths(FastPaths())
        plain = with_paths(FastPaths.plain())
        result = FidelityResult(case.name, bias_shift, probe.max_ratio, scale, _error(default, truth, scale),
                                _error(plain, truth, scale), init=init)
        plain64 = plain.double()
        m32.fast = FastPaths.plain()
        runs_plain = m32.active_fast()
        for name in (paths if paths is not None else m32.fast_fields):
            m32.fast = FastPaths(**{f: f == name for f in FastPaths.names()})
            # a path this pass does not take here (channels-last in an fp32 pass on the CPU) runs the plain path
            out = plain if m32.active_fast() == runs_plain else with_paths(m32.fast)
            result.alone_vs_plain[name] = _error(out, plain64, scale)
            result.alone_vs_fp64[name] = _error(out, truth, scale)
        if repeat > 0:
            _time_default(result, m32, run, truth, scale, repeat)
    return result


def _time_default(result: FidelityResult, m32: torch.nn.Module, run: Callable, truth: torch.Tensor, scale: float,
                  repeat: int) -> None:
    """Median times of the default and the plain path in rounds whose order rotates, and the time the default
    spends inside GroupNorm. Where the default runs channels-last, also the default with PyTorch's one-pass
    channels-last statistics (and its norms' time) and without channels-last; where fp32 on the CPU runs
    contiguous (`channels_last_keeps_fp32`), the default with channels-last forced on (`channels_last_in_cpu_fp32`:
    the kernels it ran before) and that run's error. Each variant with other weight layouts has its own model:
    switching `fast` between runs would re-lay the weights inside the timed runs."""
    plain_model = copy.deepcopy(m32)
    plain_model.fast = FastPaths.plain()
    m32.fast = FastPaths()
    norm_s: dict[str, list[float]] = {"default": [], "native": []}

    def timed_norms(variant: str, fn: Callable[[], torch.Tensor]) -> Callable[[], torch.Tensor]:
        def call() -> torch.Tensor:
            spent = []
            with timing_group_norms(spent.append):
                out = fn()
            norm_s[variant].append(sum(spent))
            return out
        return call

    variants = {"default": timed_norms("default", lambda: run(m32, torch.float32))}
    if m32.active_fast().channels_last:
        contiguous_model = copy.deepcopy(m32)
        contiguous_model.fast = FastPaths().without("channels_last")

        def native_stats() -> torch.Tensor:
            with native_channels_last_group_norm():
                return run(m32, torch.float32)

        variants["default_native_stats"] = timed_norms("native", native_stats)
        variants["default_without_channels_last"] = lambda: run(contiguous_model, torch.float32)
    else:
        channels_last_model = copy.deepcopy(m32)
        with channels_last_in_cpu_fp32():  # its weights held channels-last, as the default held them before
            channels_last_model.fast = FastPaths()

        def forced_channels_last() -> torch.Tensor:
            with channels_last_in_cpu_fp32():
                return run(channels_last_model, torch.float32)

        variants["default_channels_last"] = forced_channels_last
    variants["plain"] = lambda: run(plain_model, torch.float32)
    for fn in variants.values():  # warm-up
        fn()
    for series in norm_s.values():
        series.clear()
    times, outs = interleaved_ms(list(variants.values()), "cpu", repeat, rotate=True)
    result.rounds_s = {name: [round(t / 1e3, 3) for t in ts] for name, ts in zip(variants, times)}
    medians = {name: statistics.median(ts) / 1e3 for name, ts in zip(variants, times)}
    out_of = dict(zip(variants, outs))
    result.default_s, result.plain_s = medians["default"], medians["plain"]
    result.default_group_norm_s = statistics.median(norm_s["default"])
    if "default_native_stats" in variants:
        result.default_native_stats_s = medians["default_native_stats"]
        result.default_without_channels_last_s = medians["default_without_channels_last"]
        result.default_native_stats_group_norm_s = statistics.median(norm_s["native"])
        result.default_native_stats_vs_fp64 = _error(out_of["default_native_stats"], truth, scale)
    else:
        result.default_channels_last_s = medians["default_channels_last"]
        result.default_channels_last_vs_fp64 = _error(out_of["default_channels_last"], truth, scale)


def markdown(path: Path) -> str:
    """The table docs show for a fidelity results file (docs/seedvr2.md renders it; a test checks they agree)."""
    data = json.loads(Path(path).read_text())
    lines = ["| case | largest mean/std at a norm | default vs fp64 | plain vs fp64 | worst path alone vs plain | "
             "default with PyTorch's channels-last stats vs fp64 | default s | with PyTorch's stats s | "
             "without channels-last s | plain s | GroupNorm s, default | GroupNorm s, PyTorch's stats |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def num(v: Optional[float], fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    for r in data["results"]:
        worst = max(r["alone_vs_plain"].items(), key=lambda kv: kv[1]) if r["alone_vs_plain"] else None
        lines.append(" | ".join([
            f"| {r['case']}", f"{r['max_norm_mean_over_std']:.0f}", f"{r['default_vs_fp64']:.1e}",
            f"{r['plain_vs_fp64']:.1e}", f"{worst[1]:.1e} ({worst[0]})" if worst else "",
            num(r.get("default_native_stats_vs_fp64"), ".1e"), num(r.get("default_s"), ".2f"),
            num(r.get("default_native_stats_s"), ".2f"), num(r.get("default_without_channels_last_s"), ".2f"),
            num(r.get("plain_s"), ".2f"), num(r.get("default_group_norm_s"), ".3f"),
            num(r.get("default_native_stats_group_norm_s"), ".3f")]) + " |")
    return "\n".join(lines)


def markdown_paths(path: Path) -> str:
    """The fast-path table docs show for a fidelity results file: the layout the default ran, each error against
    float64 and as a multiple of the plain path's (the bar: every path alone within 2x, docs/seedvr2.md), and the
    default's time next to the other layout's, timed in the same rounds (without channels-last where the default
    ran it, channels-last forced where it ran contiguous)."""
    data = json.loads(Path(path).read_text())
    lines = ["| case | weights | default's layout | plain vs fp64 | default vs fp64 | default / plain | "
             "worst path alone / plain | default s | default without channels-last s | "
             "default, channels-last forced: vs fp64 | default, channels-last forced s | plain s |",
             "|---|---|---|---|---|---|---|---|---|---|---|---|"]

    def layout(r: dict) -> str:  # which variants were timed says what the default ran (`_time_default`)
        if r.get("default_channels_last_s") is not None:
            return "contiguous"
        return "channels-last" if r.get("default_without_channels_last_s") is not None else ""

    def num(v: Optional[float], fmt: str) -> str:
        return "" if v is None else format(v, fmt)

    for r in data["results"]:
        plain = r["plain_vs_fp64"]
        worst = max(r["alone_vs_fp64"].items(), key=lambda kv: kv[1]) if r.get("alone_vs_fp64") else None
        init = r.get("init", "fan_in").replace("_", "-")
        weights = init if not r["bias_shift"] else f"{init}, biases ±{r['bias_shift']:g}"
        lines.append(" | ".join([
            f"| {r['case']}", weights, layout(r), f"{plain:.2e}", f"{r['default_vs_fp64']:.2e}",
            f"{r['default_vs_fp64'] / plain:.2f}", f"{worst[1] / plain:.2f} ({worst[0]})" if worst else "",
            num(r.get("default_s"), ".2f"), num(r.get("default_without_channels_last_s"), ".2f"),
            num(r.get("default_channels_last_vs_fp64"), ".2e"), num(r.get("default_channels_last_s"), ".2f"),
            num(r.get("plain_s"), ".2f")]) + " |")
    return "\n".join(lines)


def main(argv: Optional[Sequence[str]] = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m turbovae.bench.fidelity", description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, help="JSON file to write (rewritten after each case)")
    parser.add_argument("--markdown", type=Path, help="print the docs table of a results file written by --out")
    parser.add_argument("--paths", action="store_true",
                        help="with --markdown: the fast-path table (each path's error against the plain path's)")
    parser.add_argument("--cases", nargs="*", default=(), help="keep cases whose name contains one of these")
    parser.add_argument("--bias-shift", type=float, default=20.0)
    parser.add_argument("--init", choices=INITS, default="fan_in",
                        help="seeded weights: fan-in-scaled normals, or the reference code's own initialisation")
    parser.add_argument("--threads", type=int, default=None)
    parser.add_argument("--repeat", type=int, default=3, help="timed rounds of the default path (0: no timing)")
    args = parser.parse_args(argv)
    if args.markdown:
        print(markdown_paths(args.markdown) if args.paths else markdown(args.markdown))
        return 0
    if args.out is None:
        parser.error("--out FILE is required (or --markdown FILE)")
    if args.threads:
        torch.set_num_threads(args.threads)
    env = environment()
    cases = [c for c in for_section("fidelity") if not args.cases or any(s in c.name for s in args.cases)]
    results = []
    for case in cases:
        results.append(run_case(case, bias_shift=args.bias_shift, repeat=args.repeat, init=args.init))
        print(json.dumps(asdict(results[-1])), flush=True)
        payload = {"environment": env, "section": "fidelity", "complete": len(results) == len(cases),
                   "results": [asdict(r) for r in results]}
        atomic_write_text(args.out, json.dumps(payload, indent=2), overwrite=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
