"""Hugging Face models in and out: ``save_pretrained`` writes a folder ``from_pretrained`` loads, each rank writing
only its shards; ``load_pretrained`` reads one into a model of any layout, each rank reading only what it holds.
Training HF models as they are (their FSDP units, blocks and TP plan) is the strategies' (see docs/hf.md)."""
from trainer.hf.pretrained import load_pretrained, save_pretrained

__all__ = ["load_pretrained", "save_pretrained"]
