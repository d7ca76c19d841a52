"""A small sequence-to-sequence Transformer language model (Lightning's ``demos.Transformer`` and
``LightningTransformer`` after the rename), for examples such as Fabric's language-model script.

``Transformer(vocab_size, ninp, nhead, nhid, nlayers, dropout)(inputs, target)`` takes token ids of shape
``(batch, time)`` (``target`` already shifted by one) and returns log-probabilities of shape
``(batch * time, vocab_size)``, ready for ``F.nll_loss(output, target.view(-1))``.
"""
from __future__ import annotations

import math
from typing import Any, Optional

import torch
from torch import Tensor, nn
from torch.nn import functional as F

from trainer.module.train_module import TrainModule


class PositionalEncoding(nn.Module):
    """Adds the sinusoidal encoding of each position (along the time dimension) to the embeddings, then dropout.
    The table is built on first use on the input's device (not a buffer, so state dicts stay the weights only)."""

    def __init__(self, dim: int, dropout: float = 0.1, max_len: int = 5000) -> None:
        super().__init__()
        self.dropout = nn.Dropout(p=dropout)
        self.dim = dim
        self.max_len = max_len
        self.pe: Optional[Tensor] = None

    def forward(self, x: Tensor) -> Tensor:
        """``x``: ``(batch, time, dim)``."""
        if self.pe is None or self.pe.device != x.device:
            self.pe = self._table(x.device)
        return self.dropout(x + self.pe[: x.size(1)].to(x.dtype))

    def _table(self, device: torch.device) -> Tensor:
        position = torch.arange(self.max_len, dtype=torch.float, device=device).unsqueeze(1)
        frequency = torch.exp(torch.arange(0, self.dim, 2, device=device).float() * (-math.log(10000.0) / self.dim))
        table = torch.zeros(self.max_len, self.dim, device=device)
        table[:, 0::2] = torch.sin(position * frequency)
        table[:, 1::2] = torch.cos(position * frequency[: self.dim // 2])
        return table


class Transformer(nn.Module):
    """Token embedding, positional encoding, ``nn.Transformer`` (batch first) and a linear decoder to the
    vocabulary; Lightning's defaults (WikiText-2's 33278 words, width 200, 2 heads, 2 layers, dropout 0.2)."""

    def __init__(self, vocab_size: int = 33278, ninp: int = 200, nhead: int = 2, nhid: int = 200, nlayers: int = 2,
                 dropout: float = 0.2) -> None:  # fmt: skip
        super().__init__()
        self.pos_encoder = PositionalEncoding(ninp, dropout)
        self.embedding = nn.Embedding(vocab_size, ninp)
        self.transformer = nn.Transformer(d_model=ninp, nhead=nhead, num_encoder_layers=nlayers,
                                          num_decoder_layers=nlayers, dim_feedforward=nhid, dropout=dropout,
                                          batch_first=True)  # fmt: skip
        self.decoder = nn.Linear(ninp, vocab_size)
        self.ninp = ninp
        self.vocab_size = vocab_size

    def forward(self, inputs: Tensor, target: Tensor, mask: Optional[Tensor] = None) -> Tensor:
        """Log-probabilities ``(batch * time, vocab_size)`` of the next token; ``mask`` defaults to causal."""
        if inputs.dim() != 2 or target.shape != inputs.shape:
            raise ValueError(f"Transformer(inputs, target) takes two (batch, time) tensors of token ids of the same "
                             f"shape; got {tuple(inputs.shape)} and {tuple(target.shape)}.")  # fmt: skip
        length = inputs.size(1)
        if mask is None:
            mask = nn.Transformer.generate_square_subsequent_mask(length, device=inputs.device)
        scale = math.sqrt(self.ninp)
        source = self.pos_encoder(self.embedding(inputs) * scale)
        shifted = self.pos_encoder(self.embedding(target) * scale)
        output = self.decoder(self.transformer(source, shifted, tgt_mask=mask))
        return F.log_softmax(output, dim=-1).view(-1, self.vocab_size)


class LightningTransformer(TrainModule):
    """:class:`Transformer` as a TrainModule: ``batch`` is ``(inputs, target)``; the loss is the negative
    log-likelihood; SGD with learning rate 0.1."""

    def __init__(self, vocab_size: int = 33278) -> None:
        super().__init__()
        self.model = Transformer(vocab_size=vocab_size)

    def forward(self, inputs: Tensor, target: Tensor) -> Tensor:
        """The model's log-probabilities."""
        return self.model(inputs, target)

    def training_step(self, batch: tuple[Tensor, Tensor], batch_idx: int) -> Tensor:
        """The language-model loss of one batch."""
        inputs, target = batch
        return F.nll_loss(self(inputs, target), target.view(-1))

    def configure_optimizers(self) -> Any:
        """SGD, learning rate 0.1."""
        return torch.optim.SGD(self.model.parameters(), lr=0.1)
