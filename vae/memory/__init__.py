"""Memory, in one place: what a device has free (`device`), the budget a pass may use (`budget`), a pass's
storages counted while they live and its peak among them (`peak`, with what kernels allocate inside ops:
`op_rules`, `cpu_conv`, `meta_device`; the pass run on meta tensors to predict it is planning's:
vae/planning/meta_pass.py), the peak the allocator measured (`allocator`), where a pass keeps what it holds
(`placement`) and what an allocation failure is (`oom`). The causal state a pass carries between steps is a cache
(`vae/causal_cache.py`'s `CausalCache`), not this package's business."""
