"""Asynchronous checkpoint saves: copy the state on the training thread, write it in the background.

:class:`BackgroundWriter` runs one save at a time in a writer thread:

- ``submit`` first waits for the save in flight (at most one), then the caller stages the new state — its tensors
  copied into CPU buffers kept from the previous save (pinned memory for CUDA tensors, copied with
  ``non_blocking`` and awaited by the writer, so the training thread never synchronises with the device) — and
  the write starts. Training, optimizer steps included, goes on at once: it changes the live tensors, not the
  copy. Only the next save waits, and only while the previous write is unfinished.
- full files are written by the thread with :func:`~trainer.strategies.checkpoint.checkpoint_io.atomic_save` (temporary name,
  fsync, rename); sharded folders by ``torch.distributed.checkpoint.async_save`` on a process group of their
  own (collectives on the training's group from two threads could interleave differently on each rank).
- what must follow the new checkpoint — ``last`` pointing at it, older checkpoints deleted — is queued with
  :meth:`BackgroundWriter.after_commit` and runs only once the checkpoint is complete, so a crash during a
  background write leaves the previous checkpoint, and a ``last`` that names a complete one.
- an error in the writer is raised on the training thread at its next chance: the next save, the Trainer's
  next fault check, or the end of the fit (:meth:`BackgroundWriter.raise_error`, :meth:`BackgroundWriter.wait`).
"""
from __future__ import annotations

import os
import sys
import threading
from typing import Any, Callable, Optional

import torch
from torch import Tensor


class CheckpointStager:
    """Copies the tensors of a checkpoint into buffers reused from one save to the next (same keys, shapes and
    dtypes), so the training thread can go on changing the originals while the copy is written."""

    def __init__(self) -> None:
        self._buffers: dict[tuple, Tensor] = {}
        self._cuda_copies = False
        self._copied: Optional[Any] = None  # a CUDA event recorded after the non-blocking copies

    def stage(self, obj: Any) -> Any:
        """A copy of ``obj`` (nested dicts, lists, tuples) whose tensors are CPU copies taken now."""
        self._cuda_copies, self._copied = False, None
        staged = self._copy(obj, ())
        if self._cuda_copies:
            self._copied = torch.cuda.Event()
            self._copied.record()
        return staged

    def wait_for_copies(self) -> None:
        """Block until the device-to-host copies of the last :meth:`stage` are done (writer thread)."""
        if self._copied is not None:
            self._copied.synchronize()

    def _copy(self, obj: Any, key: tuple) -> Any:
        if isinstance(obj, Tensor):
            return self._copy_tensor(obj, key)
        if isinstance(obj, dict):
            return {k: self._copy(v, key + (k,)) for k, v in obj.items()}
        if isinstance(obj, list):
            return [self._copy(v, key + (i,)) for i, v in enumerate(obj)]
        if isinstance(obj, tuple) and not hasattr(obj, "_fields"):
            return tuple(self._copy(v, key + (i,)) for i, v in enumerate(obj))
        return obj  # numbers, strings, None, RNG states' arrays (fresh objects): nothing the training changes

    def _copy_tensor(self, tensor: Tensor, key: tuple) -> Tensor:
        tensor = tensor.detach()
        if tensor.layout is not torch.strided or type(tensor) is not Tensor:
            return tensor.to("cpu", copy=True)  # sparse, DTensor, subclasses: a plain copy, not cached
        buffer = self._buffers.get(key)
        if buffer is None or buffer.shape != tensor.shape or buffer.dtype != tensor.dtype:
            pin = tensor.is_cuda
            buffer = torch.empty(tensor.shape, dtype=tensor.dtype, device="cpu", pin_memory=pin)
            self._buffers[key] = buffer
        buffer.copy_(tensor, non_blocking=tensor.is_cuda)
        self._cuda_copies = self._cuda_copies or tensor.is_cuda
        return buffer


class BackgroundWriter:
    """Writes one checkpoint at a time in a background thread (see the module docstring)."""

    def __init__(self) -> None:
        self.stager = CheckpointStager()
        self._thread: Optional[threading.Thread] = None
        self._lock = threading.Lock()
        self._after: list[Callable[[], None]] = []
        self._done = True
        self._error: Optional[BaseException] = None
        self._path = ""
        self._process_group: Any = None
        self._dcp_stager: Any = None

    def __getstate__(self) -> dict[str, Any]:
        self.wait()  # a Trainer sent to spawned processes takes no thread along; its saves are complete first
        return {}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__()  # type: ignore[misc]

    @property
    def busy(self) -> bool:
        """Whether a write is in flight."""
        return self._thread is not None and self._thread.is_alive()

    def submit(self, write: Callable[[], None], path: Any) -> None:
        """Run ``write`` in the writer thread, after the save in flight (if any) has finished."""
        self.wait()
        self._path, self._after, self._done = os.fspath(path), [], False
        self._thread = threading.Thread(target=self._run, args=(write,), name="trainer-checkpoint-writer")
        self._thread.start()

    def save_file(self, checkpoint: dict[str, Any], path: Any) -> None:
        """Stage ``checkpoint`` now and write it as one file (atomically) in the background."""
        from trainer.strategies.checkpoint.checkpoint_io import atomic_save

        self.wait()  # the stager's buffers still hold the previous save until its write is done
        staged = self.stager.stage(checkpoint)

        def write() -> None:
            self.stager.wait_for_copies()
            atomic_save(staged, path)

        self.submit(write, path)

    def after_commit(self, action: Callable[[], None]) -> None:
        """Run ``action`` once the checkpoint in flight is complete (now, when none is)."""
        with self._lock:
            if not self._done:
                self._after.append(action)
                return
        action()

    def _run(self, write: Callable[[], None]) -> None:
        try:
            write()
            while True:
                with self._lock:
                    if not self._after:
                        self._done = True
                        return
                    action = self._after.pop(0)
                action()
        except BaseException as err:  # kept for the training thread
            with self._lock:
                self._error, self._after, self._done = err, [], True
            print(f"[trainer] the background write of checkpoint '{self._path}' failed: {type(err).__name__}: {err} "
                  "(raised on the training thread at its next save or check)", file=sys.stderr, flush=True)  # fmt: skip

    def wait(self) -> None:
        """Block until the save in flight is complete; raise its error, if it failed."""
        thread = self._thread
        if thread is not None:
            thread.join()
            self._thread = None
        self.raise_error()

    def raise_error(self) -> None:
        """Raise the error of a background write that failed (once), on the calling (training) thread."""
        error, self._error = self._error, None
        if error is not None:
            note = f"(raised on the training thread: the background write of '{self._path}' failed)"
            if hasattr(error, "add_note"):
                error.add_note(note)
            raise error

    # ------------------------------------------------------------------ sharded folders (DCP)
    def process_group(self) -> Any:
        """A gloo group for ``dcp.async_save``'s collectives, created (by every rank, on the training thread) on
        the first sharded asynchronous save; ``None`` outside a process group."""
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            return None
        if self._process_group is None:
            self._process_group = dist.new_group(backend="gloo")
        return self._process_group

    def dcp_stager(self) -> Any:
        """DCP's staging (it knows DTensors): a copy to CPU memory taken on the training thread, into pinned
        buffers kept between saves where CUDA is used."""
        from torch.distributed.checkpoint.staging import BlockingAsyncStager

        if self._dcp_stager is None:
            self._dcp_stager = BlockingAsyncStager(cache_staged_state_dict=torch.cuda.is_available())
        return self._dcp_stager
