"""``DistributedSampler``: each rank reads its own shard of the dataset.

torch's semantics exactly: every rank gets ``num_samples`` indices, the same
count on every rank so no rank waits in a collective for a batch that never
comes.  Without ``drop_last`` the index list is padded by repeating its head
until it divides evenly; with ``drop_last`` the tail is cut instead.  Rank r
takes every ``num_replicas``-th index starting at r.  With ``shuffle`` the
order is a permutation seeded by ``seed + epoch``: identical on every rank
(no communication needed), different each epoch once ``set_epoch`` is called.
The permutation comes from NumPy's PCG64 (``np.random.default_rng``), so the
shuffled order differs from torch's; the unshuffled shards match torch's.
"""
import math

import numpy as np

from .sampler import Sampler

__all__ = ["DistributedSampler"]


def _check_int(name, value, low):
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < low:
        raise ValueError(f"DistributedSampler: {name} must be an int >= {low}, got {value!r}")
    return int(value)


class DistributedSampler(Sampler):
    def __init__(self, dataset, num_replicas=None, rank=None, shuffle=True, seed=0,
                 drop_last=False):
        if num_replicas is None or rank is None:
            from pyflow.distributed import env
            num_replicas = env.get_world_size() if num_replicas is None else num_replicas
            rank = env.get_rank() if rank is None else rank
        num_replicas = _check_int("num_replicas", num_replicas, 1)
        rank = _check_int("rank", rank, 0)
        if rank >= num_replicas:
            raise ValueError(f"Invalid rank {rank}, rank should be in the interval "
                             f"[0, {num_replicas - 1}]")
        self.dataset = dataset
        self.num_replicas, self.rank = num_replicas, rank
        self.shuffle, self.seed, self.drop_last = bool(shuffle), _check_int("seed", seed, 0), \
            bool(drop_last)
        self.epoch = 0
        n = len(dataset)
        if self.drop_last and n % num_replicas:
            self.num_samples = math.ceil((n - num_replicas) / num_replicas)
        else:
            self.num_samples = math.ceil(n / num_replicas)
        self.total_size = self.num_samples * num_replicas

    def __iter__(self):
        n = len(self.dataset)
        if self.shuffle:
            indices = np.random.default_rng(self.seed + self.epoch).permutation(n).tolist()
        else:
            indices = list(range(n))
        if not self.drop_last:
            pad = self.total_size - len(indices)
            if pad <= len(indices):
                indices += indices[:pad]
            else:
                indices += (indices * math.ceil(pad / len(indices)))[:pad]
        else:
            indices = indices[:self.total_size]
        assert len(indices) == self.total_size
        return iter(indices[self.rank:self.total_size:self.num_replicas])

    def __len__(self):
        return self.num_samples

    def set_epoch(self, epoch):
        """Reshuffle for ``epoch``: call it at the start of each epoch on every rank."""
        self.epoch = _check_int("epoch", epoch, 0)
