"""Lightning's ``lightning.pytorch.accelerators`` under the rename: the classes ``trainer.accelerator`` returns.

They describe the device kind a run uses; ``Trainer(accelerator=..., devices=...)`` chooses it."""
from trainer.strategies.accelerators import Accelerator, CPUAccelerator, CUDAAccelerator, MPSAccelerator

__all__ = ["Accelerator", "CPUAccelerator", "CUDAAccelerator", "MPSAccelerator"]
