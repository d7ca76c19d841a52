"""Checkpoint storage: how checkpoint files and folders are written, checked and read.

Atomic single-file IO and safe loading, manifests (sizes and CRCs), local and fsspec storage, sharded folders
(torch.distributed.checkpoint) and asynchronous saves. Which state goes in a checkpoint is the Trainer's."""
