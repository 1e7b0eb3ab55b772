"""Benchmarks (not timed tests): each compares an optimisation against its baseline in the same run."""
