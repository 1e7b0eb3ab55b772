"""Stands in for core's parsed command line (the bench sets `args.cpu` before importing comfy.sd)."""


class _Args:
    cpu = False


args = _Args()
