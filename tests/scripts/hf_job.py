"""Jobs for tests/test_hf.py: transformers models trained as they are on 2 gloo ranks, exported and imported.

    python hf_job.py --out DIR --job train    # Llama and GPT-2 at fsdp=2 (3 steps, exported by
                                              # trainer.hf.save_pretrained / HFCheckpoint), GPT-2 at ddp, Llama at
                                              # dp_shard=1 x tp=2, GPT-2 at tp=2 (the named error), load_pretrained
                                              # at tp=2, the export's memory

Each rank writes ``rank{N}.pt``: initial weights, losses, logits of a fixed batch after training, peak memory
during the export, the error text of GPT-2 at tp=2.
"""
from __future__ import annotations

import argparse
import faulthandler
import os
import sys
from pathlib import Path
from typing import Any, Optional

import torch
import torch.nn.functional as F
from torch.utils.data import DataLoader, TensorDataset

from trainer.hf import load_pretrained, save_pretrained
from trainer import Trainer, TrainModule, seed_everything
from trainer.callbacks import Callback, HFCheckpoint, ModelCheckpoint
from trainer.strategies import NDParallelStrategy

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # tests/ for layout_support
from layout_support import InitialWeights  # noqa: E402

VOCAB, SEQ = 32, 8


def hf_config(kind: str) -> Any:
    """A tiny config of each architecture (no download)."""
    from transformers import GPT2Config, LlamaConfig

    if kind == "llama":
        return LlamaConfig(hidden_size=64, intermediate_size=128, num_hidden_layers=2, num_attention_heads=4,
                           num_key_value_heads=2, vocab_size=VOCAB, max_position_embeddings=SEQ, bos_token_id=0,
                           eos_token_id=1, pad_token_id=None)  # fmt: skip
    return GPT2Config(n_embd=64, n_layer=2, n_head=4, vocab_size=VOCAB, n_positions=SEQ, bos_token_id=0,
                      eos_token_id=0)  # fmt: skip


class CausalLM(TrainModule):
    """A transformers causal LM built from a config (or loaded from ``load_from``) in configure_model, trained as
    it is: no plan written here."""

    def __init__(self, kind: str, load_from: Optional[str] = None) -> None:
        super().__init__()
        self.kind, self.load_from = kind, load_from
        self.model: Any = None
        self.losses: list[float] = []

    def configure_model(self) -> None:
        if self.model is not None:
            return
        from transformers import AutoModelForCausalLM

        config = getattr(self, "config", None) or hf_config(self.kind)
        self.model = AutoModelForCausalLM.from_config(config, attn_implementation="eager")
        if self.load_from is not None:
            load_pretrained(self.model, self.load_from)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.model(tokens).logits

    def training_step(self, batch, batch_idx):
        tokens, target = batch
        logits = self(tokens)
        loss = F.cross_entropy(logits.flatten(0, 1), target.flatten(0, 1))
        self.losses.append(float(loss.detach()))
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    tokens = torch.randint(0, VOCAB, (24, SEQ + 1), generator=generator)
    return TensorDataset(tokens[:, :-1], tokens[:, 1:])


def probe() -> torch.Tensor:
    """The fixed batch whose logits the test compares."""
    return torch.randint(0, VOCAB, (2, SEQ), generator=torch.Generator().manual_seed(7))


def logits_of(module: CausalLM) -> torch.Tensor:
    """The model's logits on the probe batch, through the strategy's root (FSDP gathers its units)."""
    root = getattr(module.trainer.strategy, "_root", None)
    training = module.training
    module.eval()  # no dropout (GPT-2 has some), as from_pretrained's model
    with torch.no_grad():
        out = (root or module)(probe())  # the FSDP root's forward runs the module's
    module.train(training)
    return (out.full_tensor() if hasattr(out, "full_tensor") else out).detach().clone()


class StartLogits(Callback):
    """The probe batch's logits when training starts."""

    logits: Optional[torch.Tensor] = None

    def on_train_start(self, trainer, module):
        self.logits = logits_of(module)


def fit(strategy: Any, module: CausalLM, steps: int = 3, devices: int = 2, callbacks: tuple = (),
        checkpointing: bool = False) -> tuple[Trainer, dict]:  # fmt: skip
    """Seeds, trains ``steps`` steps; returns the Trainer and the weights the rank held when training started."""
    seed_everything(0)
    initial = InitialWeights()
    trainer = Trainer(accelerator="cpu", devices=devices, strategy=strategy, max_steps=steps, logger=False,
                      enable_checkpointing=checkpointing, enable_progress_bar=False, enable_model_summary=False,
                      callbacks=[initial, *callbacks])  # fmt: skip
    trainer.fit(module, DataLoader(dataset(), batch_size=4))
    return trainer, initial.weights


class RssPeak:
    """The highest resident set size of this process while inside the block, sampled every 0.2 ms."""

    def __init__(self) -> None:
        import threading

        self.peak = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)

    @staticmethod
    def rss() -> int:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")

    def _sample(self) -> None:
        while not self._stop.is_set():
            self.peak = max(self.peak, self.rss())
            self._stop.wait(0.0002)

    def __enter__(self) -> "RssPeak":
        self.peak = self.rss()
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()
        self.peak = max(self.peak, self.rss())


def export_memory(directory: Path) -> dict:
    """A larger Llama (~92 MB fp32) sharded by fsdp=2, exported with 4 MB files: this rank's RSS growth during the
    export, beside its shards' bytes, the largest file's and the model's; then the same from its sharded checkpoint
    (what `trainer checkpoint export` does), on rank 0."""
    import safetensors.torch  # noqa: F401 - imported before the baseline, as by any earlier export
    from transformers import LlamaConfig

    big = LlamaConfig(hidden_size=512, intermediate_size=1024, num_hidden_layers=8, num_attention_heads=8,
                      num_key_value_heads=8, vocab_size=2048, max_position_embeddings=SEQ)  # fmt: skip
    module = CausalLM("llama")
    module.config = big
    fit("fsdp", module, steps=1)
    params = list(module.model.state_dict().values())
    local = sum(p.to_local().numel() * p.element_size() for p in params)
    whole = sum(p.numel() * p.element_size() for p in params)
    import ctypes
    import gc

    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # freed memory back to the system: growth is new memory, not reuse
    with RssPeak() as peak:
        before = RssPeak.rss()
        save_pretrained(module, directory, max_shard_size="4MB")
    largest = max(f.stat().st_size for f in directory.glob("*.safetensors"))
    report = {"export_growth": peak.peak - before, "export_local": local, "export_model": whole,
              "export_largest_file": largest, "export_files": len(list(directory.glob("*.safetensors")))}
    module.trainer.save_checkpoint(directory.parent / "big.ckpt")  # sharded: weights and AdamW's state
    torch.distributed.barrier()
    if torch.distributed.get_rank() == 0:  # `trainer checkpoint export`'s work, in this process to measure it
        from trainer.strategies.checkpoint.hf_folder import export_checkpoint

        del params
        gc.collect()
        ctypes.CDLL("libc.so.6").malloc_trim(0)
        with RssPeak() as peak:
            before = RssPeak.rss()
            export_checkpoint(directory.parent / "big.ckpt", directory.parent / "big_exported", big,
                              max_shard_size="4MB")  # fmt: skip
        report["cli_export_growth"] = peak.peak - before
    return report


def train_job(out: Path) -> dict:
    report: dict = {}
    rank = int(os.environ.get("RANK", "0"))
    for kind in ("llama", "gpt2"):
        module = CausalLM(kind)
        # GPT-2 exported by the callback, Llama by a call after fit
        callbacks = (HFCheckpoint(out / "gpt2_fsdp", max_shard_size="60KB"),) if kind == "gpt2" else ()
        trainer, report[f"{kind}_fsdp_initial"] = fit("fsdp", module, callbacks=callbacks)
        report[f"{kind}_fsdp_losses"] = module.losses
        report[f"{kind}_fsdp_units"] = sorted({type(m).__name__ for m in trainer.strategy._units})
        report[f"{kind}_fsdp_logits"] = logits_of(module)
        if kind == "llama":
            save_pretrained(module, out / f"{kind}_fsdp", max_shard_size="60KB")
        trainer.save_checkpoint(out / f"{kind}_fsdp.ckpt")  # a sharded folder, for `trainer checkpoint export`
    module = CausalLM("gpt2")  # DDP: every rank holds the whole model; one writes each tensor
    fit("ddp", module)
    report["gpt2_ddp_logits"] = logits_of(module)
    save_pretrained(module, out / "gpt2_ddp", max_shard_size="60KB")
    module = CausalLM("llama")
    # ModelCheckpoint(save_hf=True) beside its (sharded) checkpoint: llama_tp2_mc/trained.hf
    checkpoint = ModelCheckpoint(out / "llama_tp2_mc", filename="trained", every_n_train_steps=3, save_hf=True)
    trainer, report["llama_tp2_initial"] = fit(NDParallelStrategy(dp_shard=1, tp=2), module, callbacks=(checkpoint,),
                                               checkpointing=True)  # fmt: skip
    report["llama_tp2_losses"] = module.losses
    report["llama_tp2_sharded"] = sorted(n for n, p in module.named_parameters() if hasattr(p, "placements"))
    report["llama_tp2_logits"] = logits_of(module)
    save_pretrained(module, out / "llama_tp2", max_shard_size="60KB")
    trainer.save_checkpoint(out / "llama_tp2.ckpt")
    start = StartLogits()
    fit(NDParallelStrategy(dp_shard=1, tp=2), CausalLM("llama", load_from=str(out / "llama_fsdp")), steps=1,
        callbacks=(start,))  # fmt: skip
    report["llama_tp2_loaded_logits"] = start.logits
    report.update(export_memory(out / "big"))
    try:
        fit(NDParallelStrategy(dp_shard=1, tp=2), CausalLM("gpt2"))
    except Exception as err:  # noqa: BLE001 - the test reads the message
        report["gpt2_tp2_error"] = f"{type(err).__name__}: {err}"
    report["rank"] = rank
    return report


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--out", required=True)
    parser.add_argument("--job", required=True, choices=("train",))
    args = parser.parse_args()
    torch.set_num_threads(1)
    faulthandler.dump_traceback_later(300, exit=True)  # a hang fails with a traceback
    report = {"train": train_job}[args.job](Path(args.out))
    torch.save(report, Path(args.out) / f"rank{torch.distributed.get_rank()}.pt")


if __name__ == "__main__":
    main()
