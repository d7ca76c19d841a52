"""How dataloaders are split across ranks. The split is computed per rank from ``num_replicas``/``rank``,
so every rank's share can be checked here side by side, without starting processes."""
from __future__ import annotations

import pytest
import torch
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset, WeightedRandomSampler

from trainer.strategies.errors import ConfigurationError
from trainer.data.loaders import prepare_loader
from trainer.data.distributed import EvaluationDistributedSampler, distribute_loader


def dataset(n: int) -> TensorDataset:
    return TensorDataset(torch.arange(n))


def epoch(loader: DataLoader, number: int = 0) -> list[list[int]]:
    loader.sampler.set_epoch(number)
    return [batch[0].tolist() for batch in loader]


def shares(loader: DataLoader, world: int, training: bool = True) -> list[DataLoader]:
    return [distribute_loader(loader, {"num_replicas": world, "rank": rank}, training) for rank in range(world)]


def test_sequential_loader_stays_sequential_two_ranks_of_b_equal_one_process_of_2b():
    ranks = shares(DataLoader(dataset(16), batch_size=2), world=2)
    one_process = [batch[0].tolist() for batch in DataLoader(dataset(16), batch_size=4)]
    per_step = [sorted(a + b) for a, b in zip(epoch(ranks[0]), epoch(ranks[1]))]
    assert per_step == one_process
    assert all(isinstance(r.sampler, DistributedSampler) for r in ranks)


def test_shuffled_loader_uses_one_seed_on_every_rank_and_reshuffles_per_epoch(monkeypatch):
    monkeypatch.setenv("TRAINER_SEED", "7")
    ranks = shares(DataLoader(dataset(20), batch_size=5, shuffle=True), world=2)
    first = [sum(epoch(r, 0), []) for r in ranks]
    assert sorted(first[0] + first[1]) == list(range(20))  # disjoint shares of one permutation
    assert first[0] != list(range(0, 20, 2))  # actually shuffled
    again = [sum(epoch(r, 0), []) for r in shares(DataLoader(dataset(20), batch_size=5, shuffle=True), world=2)]
    assert again == first  # reproducible from the seed
    assert sum(epoch(ranks[0], 1), []) != first[0]  # set_epoch reshuffles


def test_drop_last_drops_the_tail_instead_of_padding_it():
    ranks = shares(DataLoader(dataset(11), batch_size=2, drop_last=True), world=2)
    steps = [epoch(r) for r in ranks]
    assert len(steps[0]) == len(steps[1]) == len(DataLoader(dataset(11), batch_size=4, drop_last=True)) == 2
    seen = sum(steps[0] + steps[1], [])
    assert len(seen) == len(set(seen)) == 8


def test_training_without_drop_last_pads_so_every_rank_runs_the_same_batches():
    ranks = shares(DataLoader(dataset(5), batch_size=2), world=2)
    assert [len(r) for r in ranks] == [2, 2]


def test_evaluation_split_counts_every_sample_exactly_once():
    ranks = shares(DataLoader(dataset(7), batch_size=2), world=2, training=False)
    assert all(isinstance(r.sampler, EvaluationDistributedSampler) for r in ranks)
    seen = [sum(epoch(r), []) for r in ranks]
    assert [len(s) for s in seen] == [len(r.sampler) for r in ranks] == [4, 3]
    assert sorted(seen[0] + seen[1]) == list(range(7))


def test_loader_settings_survive_the_rebuild():
    def collate(batch):
        return torch.stack([item[0] for item in batch]) * 10

    loader = DataLoader(dataset(8), batch_size=4, collate_fn=collate, pin_memory=False, timeout=0)
    rebuilt = distribute_loader(loader, {"num_replicas": 2, "rank": 1}, True)
    assert rebuilt.collate_fn is collate and rebuilt.batch_size == 4
    assert [b.tolist() for b in rebuilt] == [[10, 30, 50, 70]]


def test_loaders_that_are_already_split_or_opted_out_are_left_alone():
    kwargs = {"num_replicas": 2, "rank": 0}
    own = DataLoader(dataset(8), sampler=DistributedSampler(dataset(8), num_replicas=2, rank=0))
    assert distribute_loader(own, kwargs, True) is own

    class Stream(IterableDataset):
        def __iter__(self):
            return iter(range(4))

    stream = DataLoader(Stream())
    assert distribute_loader(stream, kwargs, True) is stream
    plain = DataLoader(dataset(8))
    assert prepare_loader(plain, kwargs, True, enabled=False) is plain  # use_distributed_sampler=False
    assert prepare_loader(plain, None, True, enabled=True) is plain  # one process


def test_custom_samplers_are_refused_with_a_way_out():
    weighted = DataLoader(dataset(8), sampler=WeightedRandomSampler([1.0] * 8, 8))
    with pytest.raises(ConfigurationError, match="use_distributed_sampler=False"):
        distribute_loader(weighted, {"num_replicas": 2, "rank": 0}, True)
    batches = DataLoader(dataset(8), batch_sampler=[[0, 1], [2, 3]])
    with pytest.raises(ConfigurationError, match="batch_sampler"):
        distribute_loader(batches, {"num_replicas": 2, "rank": 0}, True)
