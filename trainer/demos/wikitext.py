"""WikiText-2 as a word-level language-model dataset (Lightning's ``demos.WikiText2`` after the rename), read
from a local text file: nothing is downloaded.

``WikiText2(data_dir, block_size)`` reads ``data_dir/wikitext-2.txt`` (any text: one line, one sentence; the
original is pytorch/examples' ``word_language_model/data/wikitext-2/train.txt``), numbers its words in order of
first appearance (with ``<eos>`` closing each line) and yields ``(inputs, target)`` blocks of ``block_size`` ids,
``target`` shifted by one word.
"""
from __future__ import annotations

import os
from pathlib import Path
from typing import Union

import torch
from torch import Tensor
from torch.utils.data import Dataset

from trainer.strategies.errors import ConfigurationError

SOURCE = "https://raw.githubusercontent.com/pytorch/examples/main/word_language_model/data/wikitext-2/train.txt"


class Dictionary:
    """Words ↔ ids, in order of first appearance."""

    def __init__(self) -> None:
        self.word2idx: dict[str, int] = {}
        self.idx2word: list[str] = []

    def add_word(self, word: str) -> int:
        """The id of ``word``, numbering it if new."""
        if word not in self.word2idx:
            self.word2idx[word] = len(self.idx2word)
            self.idx2word.append(word)
        return self.word2idx[word]

    def __len__(self) -> int:
        return len(self.idx2word)


def tokenize(path: Union[str, os.PathLike]) -> tuple[Tensor, Dictionary]:
    """Every word of the file as one int64 tensor of ids (``<eos>`` after each line), and the dictionary."""
    dictionary = Dictionary()
    ids: list[int] = []
    with open(path, encoding="utf8") as lines:
        for line in lines:
            ids.extend(dictionary.add_word(word) for word in line.split() + ["<eos>"])
    return torch.tensor(ids, dtype=torch.int64), dictionary


class WikiText2(Dataset):
    """Blocks of ``block_size`` word ids from ``data_dir/wikitext-2.txt`` and the same block shifted by one.

    ``download`` is Lightning's argument; here nothing is fetched: a missing file is an error that says where
    to put it."""

    def __init__(self, data_dir: Union[str, os.PathLike] = Path("./data"), block_size: int = 35,
                 download: bool = True) -> None:  # fmt: skip
        super().__init__()
        self.path = Path(data_dir) / "wikitext-2.txt"
        if not self.path.is_file():
            raise ConfigurationError(
                f"WikiText2 reads '{self.path}', which does not exist (this package downloads nothing"
                f"{', whatever download= says' if download else ''}). Save the text there first, e.g. "
                f"curl -o {self.path} {SOURCE}, or point data_dir at the folder holding wikitext-2.txt."
            )
        if not isinstance(block_size, int) or block_size < 1:
            raise ConfigurationError(f"WikiText2(block_size={block_size!r}) must be a positive int.")
        self.data, self.dictionary = tokenize(self.path)
        self.block_size = block_size
        if len(self) < 1:
            raise ConfigurationError(f"'{self.path}' holds {len(self.data)} words: fewer than two blocks of "
                                     f"block_size={block_size}. Use a longer text or a smaller block_size.")  # fmt: skip

    @property
    def vocab_size(self) -> int:
        """Distinct words (``<eos>`` included)."""
        return len(self.dictionary)

    def __len__(self) -> int:
        return len(self.data) // self.block_size - 1

    def __getitem__(self, index: int) -> tuple[Tensor, Tensor]:
        start = index * self.block_size
        return self.data[start:start + self.block_size], self.data[start + 1:start + self.block_size + 1]
