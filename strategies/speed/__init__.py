"""Speed and memory options a strategy applies to the module it wraps.

``torch.compile``, activation checkpointing, CUDA side-stream batch copies, and deferred (``meta``-device)
initialisation with its materialisation."""
