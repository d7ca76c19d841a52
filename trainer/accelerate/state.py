"""``accelerator.state``: Accelerate's ``AcceleratorState`` as scripts read it (Hugging Face's examples log it
first thing: ``logger.info(accelerator.state, main_process_only=False)``), a view of the Accelerator's job."""
from __future__ import annotations

from typing import Any, Optional

import torch


class AcceleratorState:
    """The job an Accelerator runs: ``num_processes``, ``process_index``, ``local_process_index``,
    ``distributed_type``, ``mixed_precision``, ``device``, ``backend``, ``is_main_process``, ... read live from
    it; ``repr`` is Accelerate's (environment, processes, index, device, mixed precision)."""

    def __init__(self, accelerator: Any) -> None:
        self._accelerator = accelerator

    @property
    def num_processes(self) -> int:
        """Processes in the job."""
        return self._accelerator.num_processes

    @property
    def process_index(self) -> int:
        """This process's global rank."""
        return self._accelerator.process_index

    @property
    def local_process_index(self) -> int:
        """This process's rank on its machine."""
        return self._accelerator.local_process_index

    @property
    def is_main_process(self) -> bool:
        """True on global rank 0."""
        return self._accelerator.is_main_process

    @property
    def is_local_main_process(self) -> bool:
        """True on local rank 0 of each machine."""
        return self._accelerator.is_local_main_process

    @property
    def distributed_type(self) -> Any:
        """Accelerate's ``DistributedType`` of the job (``NO`` for one process)."""
        return self._accelerator.distributed_type

    @property
    def mixed_precision(self) -> str:
        """``"no"``, ``"fp16"`` or ``"bf16"``."""
        return self._accelerator.mixed_precision

    @property
    def device(self) -> torch.device:
        """The device this process computes on."""
        return self._accelerator.device

    @property
    def use_distributed(self) -> bool:
        """True with more than one process."""
        return self._accelerator.use_distributed

    @property
    def backend(self) -> Optional[str]:
        """The process group's backend ("gloo", "nccl"), None in one process."""
        import torch.distributed as dist

        return dist.get_backend() if dist.is_available() and dist.is_initialized() else None

    def __repr__(self) -> str:
        backend = self.backend
        return (
            f"Distributed environment: {self.distributed_type.value}{f'  Backend: {backend}' if backend else ''}\n"
            f"Num processes: {self.num_processes}\n"
            f"Process index: {self.process_index}\n"
            f"Local process index: {self.local_process_index}\n"
            f"Device: {self.device}\n"
            f"\nMixed precision type: {self.mixed_precision}\n"
        )
