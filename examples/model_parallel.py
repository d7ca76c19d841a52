"""A sequence-to-sequence transformer split across two devices: the encoder on one, the decoder on the other.

Model parallelism is for a model whose weights, gradients and optimizer state do not fit on one device but
whose parts run one after another, like an encoder/decoder pair. (When the batch can be split instead,
FSDP across processes is usually faster: see docs/strategies.md.) The task: reverse a sequence of digits.

    python examples/model_parallel.py                          # both "devices" are the CPU (runs anywhere)
    python examples/model_parallel.py --accelerator gpu        # encoder on cuda:0, decoder on cuda:1
    python examples/model_parallel.py --device-map auto        # balance parameter bytes automatically
"""
from __future__ import annotations

import argparse

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from trainer.strategies import ModelParallelStrategy
from trainer import Trainer, TrainModule, seed_everything

VOCAB, LENGTH, START = 10, 8, 10  # digits 0-9, sequences of 8, a start token for the decoder


def reversal_data(samples: int, seed: int) -> TensorDataset:
    """Random digit sequences and their reversals."""
    source = torch.randint(0, VOCAB, (samples, LENGTH), generator=torch.Generator().manual_seed(seed))
    return TensorDataset(source, source.flip(1))


class Encoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB, width)
        self.position = nn.Parameter(torch.randn(LENGTH, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerEncoder(layer, 2)

    def forward(self, source: torch.Tensor) -> torch.Tensor:
        return self.layers(self.embed(source) + self.position)


class Decoder(nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.embed = nn.Embedding(VOCAB + 1, width)
        self.position = nn.Parameter(torch.randn(LENGTH, width) * 0.02)
        layer = nn.TransformerDecoderLayer(width, 4, 4 * width, dropout=0.0, batch_first=True)
        self.layers = nn.TransformerDecoder(layer, 2)
        self.head = nn.Linear(width, VOCAB)
        self.register_buffer("causal", nn.Transformer.generate_square_subsequent_mask(LENGTH), persistent=False)

    def forward(self, inputs: torch.Tensor, memory: torch.Tensor) -> torch.Tensor:
        hidden = self.layers(self.embed(inputs) + self.position, memory, tgt_mask=self.causal, tgt_is_causal=True)
        return self.head(hidden)


class Reverser(TrainModule):
    """Encoder/decoder with teacher forcing: the decoder sees the target shifted right by one."""

    def __init__(self, width: int = 64, lr: float = 1e-3) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.encoder = Encoder(width)
        self.decoder = Decoder(width)

    def forward(self, source: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
        start = torch.full_like(target[:, :1], START)
        return self.decoder(torch.cat([start, target[:, :-1]], dim=1), self.encoder(source))

    def training_step(self, batch, batch_idx):
        source, target = batch
        loss = nn.functional.cross_entropy(self(source, target).reshape(-1, VOCAB), target.reshape(-1))
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        source, target = batch
        accuracy = (self(source, target).argmax(-1) == target).float().mean()
        self.log("val_token_acc", accuracy, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--device-map", default="split", choices=["split", "auto"],
                        help="split: encoder on device 0, decoder on device 1; auto: balance by parameter bytes")
    parser.add_argument("--max-epochs", type=int, default=8)
    parser.add_argument("--width", type=int, default=64)
    parser.add_argument("--root-dir", default="runs/model_parallel")
    args = parser.parse_args()

    seed_everything(0)
    torch.set_num_threads(1)
    device_map = {"encoder": 0, "decoder": 1} if args.device_map == "split" else "auto"
    # "auto" may split any submodule that does not fit whole; Encoder and Decoder add residuals and positions
    # across their children, so they are kept whole (on real GPUs a split there would mix devices).
    strategy = ModelParallelStrategy(device_map=device_map, no_split_module_classes=(Encoder, Decoder))
    trainer = Trainer(
        accelerator=args.accelerator, devices=2, strategy=strategy,
        max_epochs=args.max_epochs, default_root_dir=args.root_dir, log_every_n_steps=10,
    )  # fmt: skip
    module = Reverser(width=args.width)
    train = DataLoader(reversal_data(4096, seed=1), batch_size=64, shuffle=True)
    val = DataLoader(reversal_data(512, seed=2), batch_size=256)
    trainer.fit(module, train, val)
    devices = trainer.strategy.parallel_devices
    placement = ", ".join(f"{name} on device {index} ({devices[index]})" for name, index in trainer.strategy.device_map.items())
    print(f"placement: {placement}")
    print(f"final validation token accuracy: {float(trainer.callback_metrics['val_token_acc']):.3f}")


if __name__ == "__main__":
    main()
