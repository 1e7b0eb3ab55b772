"""The cost model's table for docs/multi_gpu.md ("Cost model and predicted scaling"):
`python -m turbovae.bench.parallel_cost` prints it; tests/test_docs.py checks the doc shows exactly this.

The model itself (FLOPs, bytes and efficiency per rank, read off the real layer shapes) is
vae/parallel/cost.py; this module only renders it."""

from __future__ import annotations

from ..vae.parallel.cost import SIZES, Assumptions, architectures, predict


def markdown(assume: Assumptions = Assumptions()) -> str:
    """The predicted-scaling table of docs/multi_gpu.md: every family the cost model covers (the registry's), every
    direction and size of SIZES."""
    lines = ["| VAE | pass | size | ranks | split | TFLOP total | TFLOP / rank | MB in / rank | "
             + " | ".join(f"eff. {l.name}" for l in assume.links) + " |",
             "|" + "---|" * (8 + len(assume.links))]
    for arch in architectures():
        for decode in (True, False):
            for size in SIZES:
                for p in predict(arch, decode, size, assume=assume):
                    effs = " | ".join(f"{p.efficiency[l.name]:.0%}" for l in assume.links)
                    lines.append(f"| {arch} | {p.pass_name} | {size} | {p.ranks} | {p.variant} | {p.total_tflop:.1f} | "
                                 f"{p.rank_tflop:.2f} | {p.rank_mbytes:.0f} | {effs} |")
    return "\n".join(lines)


if __name__ == "__main__":  # pragma: no cover
    print(markdown())
