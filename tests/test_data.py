"""graphc.utils.data against torch.utils.data: same batches, same splits, same rank shares
(where no random stream is involved), and the same argument checks."""

import numpy as np
import pytest

import graphc
from graphc.errors import ArgumentError
from graphc.utils.data import (
    BatchSampler,
    ConcatDataset,
    DataLoader,
    DistributedSampler,
    IterableDataset,
    SequentialSampler,
    TensorDataset,
    default_collate,
    random_split,
)


def _data(n=10):
    return TensorDataset(graphc.arange(float(n)).reshape(n, 1), graphc.arange(n) % 3)


def _as_lists(batches):
    return [[t.tolist() for t in b] for b in batches]


@pytest.fixture
def tdata():
    return pytest.importorskip("torch.utils.data", reason="PyTorch parity needs the parity "
                               "extra")


@pytest.mark.parametrize("batch_size, drop_last", [(1, False), (3, False), (3, True),
                                                   (10, False), (11, True)])
def test_sequential_batches_match_torch(tdata, batch_size, drop_last):
    import torch

    ours = DataLoader(_data(), batch_size=batch_size, drop_last=drop_last)
    theirs = tdata.DataLoader(tdata.TensorDataset(torch.arange(10.0).reshape(10, 1),
                                                  torch.arange(10) % 3),
                              batch_size=batch_size, drop_last=drop_last)
    assert len(ours) == len(theirs)
    assert _as_lists(ours) == _as_lists(theirs)


@pytest.mark.parametrize("n, replicas, drop_last", [(10, 3, False), (10, 3, True), (7, 2, False),
                                                    (4, 4, True), (3, 5, False)])
def test_distributed_shares_match_torch_without_shuffle(tdata, n, replicas, drop_last):
    for rank in range(replicas):
        ours = DistributedSampler(range(n), replicas, rank, shuffle=False, drop_last=drop_last)
        theirs = tdata.DistributedSampler(range(n), replicas, rank, shuffle=False,
                                          drop_last=drop_last)
        assert list(ours) == list(theirs) and len(ours) == len(theirs)


def test_distributed_shuffle_covers_everything_once_per_epoch_and_changes_with_it():
    shares = [list(DistributedSampler(range(12), 3, r, seed=5)) for r in range(3)]
    assert sorted(sum(shares, [])) == list(range(12))
    again = [list(DistributedSampler(range(12), 3, r, seed=5)) for r in range(3)]
    assert shares == again  # every rank computes the same order
    moved = DistributedSampler(range(12), 3, 0, seed=5)
    moved.set_epoch(1)
    assert list(moved) != shares[0]


def test_distributed_sampler_needs_a_group_or_explicit_ranks():
    with pytest.raises(ArgumentError, match="Default process group has not been initialized"):
        DistributedSampler(range(4))
    with pytest.raises(ArgumentError, match=r"Invalid rank 2, rank should be in the interval "
                                            r"\[0, 1\]"):
        DistributedSampler(range(4), 2, 2)


def test_shuffle_is_a_permutation_reproducible_from_the_generator():
    def order(seed):
        loader = DataLoader(_data(), batch_size=4, shuffle=True,
                            generator=graphc.Generator().manual_seed(seed))
        return [int(x) for xs, _ in loader for x in xs[:, 0].tolist()]

    assert sorted(order(0)) == list(range(10))
    assert order(0) == order(0) and order(0) != order(1)


def test_random_split_sizes_match_torch(tdata):
    import torch

    for lengths in ([3, 7], [0.7, 0.3], [0.5, 0.25, 0.25], [0.34, 0.33, 0.33]):
        ours = random_split(_data(), lengths, generator=graphc.Generator().manual_seed(0))
        theirs = tdata.random_split(range(10), lengths, generator=torch.Generator().manual_seed(0))
        assert [len(s) for s in ours] == [len(s) for s in theirs]
        assert sorted(i for s in ours for i in s.indices) == list(range(10))
    with pytest.raises(ArgumentError, match="Sum of input lengths does not equal"):
        random_split(_data(), [3, 3])


def test_collate_keeps_the_structure_torch_gives(tdata):
    import torch

    samples = [{"x": np.full(2, i, np.float32), "y": i, "w": 0.5 * i, "tag": f"s{i}",
                "pair": (i, [i, i])} for i in range(3)]
    ours, theirs = default_collate(samples), tdata.default_collate(samples)
    assert ours.keys() == theirs.keys()
    for key in ("x", "y", "w"):
        assert str(ours[key].dtype).split(".")[-1] == str(theirs[key].dtype).split(".")[-1]
        np.testing.assert_array_equal(ours[key].numpy(), theirs[key].numpy())
    assert ours["tag"] == theirs["tag"]
    assert type(ours["pair"]) is type(theirs["pair"]) is list
    assert ours["pair"][1][0].tolist() == theirs["pair"][1][0].tolist()
    assert torch.is_tensor(theirs["y"])


def test_argument_checks_match_torch_wording():
    data = _data()
    with pytest.raises(ArgumentError, match="sampler option is mutually exclusive with shuffle"):
        DataLoader(data, sampler=SequentialSampler(data), shuffle=True)
    with pytest.raises(ArgumentError, match="batch_sampler option is mutually exclusive"):
        DataLoader(data, batch_size=2, batch_sampler=BatchSampler(range(10), 2, False))
    with pytest.raises(ArgumentError, match="batch_size should be a positive integer value"):
        BatchSampler(range(3), 0, False)
    with pytest.raises(ArgumentError, match="Size mismatch between tensors"):
        TensorDataset(graphc.ones(3), graphc.ones(4))


def test_iterable_datasets_and_concatenation():
    class Stream(IterableDataset):
        def __iter__(self):
            return iter(graphc.tensor([float(i)]) for i in range(5))

    assert [b.shape[0] for b in DataLoader(Stream(), batch_size=2)] == [2, 2, 1]
    both = ConcatDataset([_data(3), _data(4)])
    assert len(both) == 7 and both[3][0].tolist() == [0.0] and both[-1][0].tolist() == [3.0]


def test_a_loader_feeds_a_compiled_training_step():
    graphc.manual_seed(0)
    model = graphc.nn.Linear(1, 3)
    opt = graphc.optim.SGD(model.parameters(), lr=0.1)

    def step(x, y):
        opt.zero_grad()
        loss = graphc.nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()

    compiled = graphc.compile(step, backend="interp")
    losses = [compiled(x, y).item() for x, y in DataLoader(_data(12), batch_size=4)]
    assert len(losses) == 3 and all(np.isfinite(losses))
