"""A model of PyTorch's CUDA caching allocator, to replay a step's allocations.

The rules, as ``c10/cuda/CUDACachingAllocator.cpp`` has them with its default settings
(no ``max_split_size_mb``, no expandable segments, one stream):

* a request is rounded up to 512 B (``kMinBlockSize``); one of at most 1 MiB
  (``kSmallSize``) is served from the small pool, whose segments are 2 MiB
  (``kSmallBuffer``), a larger one from the large pool, whose segments are 20 MiB below
  10 MiB (``kLargeBuffer``, ``kMinLargeAlloc``) and the request rounded up to 2 MiB
  (``kRoundLarge``) above;
* the free block chosen is the smallest that fits, the lowest address among equals (the
  pool's ordering by size, then address); none fits: a new segment (``cudaMalloc``);
* a block is split where the rest is at least 512 B (small pool) or more than 1 MiB
  (large pool);
* a freed block merges with its free neighbours in the same segment; segments are kept
  (reserved) until ``empty_cache``.

:mod:`validation.trace_allocator` replays the allocations of traced steps through it and
compares the reserved peak with what a GPU reported (``validation/gpu/``).

>>> a = Allocator()
>>> a.malloc("x", 3 << 20)  # 3 MiB: a 20 MiB segment, split
>>> a.malloc("y", 100)      # 100 B: a small 2 MiB segment
>>> a.reserved >> 20, a.allocated
(22, 3146240)
>>> a.free("x"); a.malloc("z", 15 << 20)  # fits in the merged 20 MiB block
>>> a.reserved >> 20
22
"""

from __future__ import annotations

import bisect
from collections.abc import Hashable

MIB = 1 << 20


class Block:
    """A block of a segment: its address, size and pool, free or not, and its neighbours."""

    __slots__ = ("addr", "free", "next", "prev", "seg", "size", "small")

    def __init__(self, seg: int, addr: int, size: int, small: bool) -> None:
        self.seg, self.addr, self.size, self.small = seg, addr, size, small
        self.free, self.prev, self.next = True, None, None


class Allocator:
    """The allocator's state: free blocks by pool, live blocks by key, and the allocated
    and reserved bytes with their peaks (since :meth:`reset_peak`)."""

    def __init__(self) -> None:
        #: free blocks of each pool (True: small) as sorted (size, address) pairs
        self.pools: dict[bool, list[tuple[int, int]]] = {True: [], False: []}
        self.by_key: dict[bool, dict[tuple[int, int], Block]] = {True: {}, False: {}}
        self.reserved = 0
        self.peak_reserved = 0
        self.allocated = 0
        self.peak_allocated = 0
        self.next_addr = 0
        self.live: dict[Hashable, Block] = {}

    def _insert(self, b: Block) -> None:
        k = (b.size, b.addr)
        bisect.insort(self.pools[b.small], k)
        self.by_key[b.small][k] = b

    def _remove(self, b: Block) -> None:
        k = (b.size, b.addr)
        pool = self.pools[b.small]
        i = bisect.bisect_left(pool, k)
        assert pool[i] == k
        pool.pop(i)
        del self.by_key[b.small][k]

    def malloc(self, key: Hashable, nbytes: int) -> None:
        """Allocate ``nbytes`` for ``key`` (a tensor's storage)."""
        size = 512 if nbytes < 512 else -(-nbytes // 512) * 512
        small = size <= MIB
        pool = self.pools[small]
        i = bisect.bisect_left(pool, (size, -1))
        if i < len(pool):
            b = self.by_key[small][pool[i]]
            self._remove(b)
        else:
            if small:
                seg_size = 2 * MIB
            elif size < 10 * MIB:
                seg_size = 20 * MIB
            else:
                seg_size = -(-size // (2 * MIB)) * 2 * MIB
            b = Block(self.next_addr, self.next_addr, seg_size, small)
            self.next_addr += seg_size
            self.reserved += seg_size
            self.peak_reserved = max(self.peak_reserved, self.reserved)
        rest = b.size - size
        if (small and rest >= 512) or (not small and rest > MIB):
            r = Block(b.seg, b.addr + size, rest, small)
            r.prev, r.next = b, b.next
            if b.next:
                b.next.prev = r
            b.next = r
            b.size = size
            self._insert(r)
        b.free = False
        self.live[key] = b
        self.allocated += b.size
        self.peak_allocated = max(self.peak_allocated, self.allocated)

    def free(self, key: Hashable) -> None:
        """Free the block of ``key`` (nothing if it has none)."""
        b = self.live.pop(key, None)
        if b is None:
            return
        self.allocated -= b.size
        b.free = True
        for nb in (b.prev, b.next):
            if nb is not None and nb.free and nb.seg == b.seg:
                self._remove(nb)
                if nb is b.prev:
                    nb.size += b.size
                    nb.next = b.next
                    if b.next:
                        b.next.prev = nb
                    b = nb
                else:
                    b.size += nb.size
                    b.next = nb.next
                    if nb.next:
                        nb.next.prev = b
        self._insert(b)

    def reset_peak(self) -> None:
        """As ``torch.cuda.reset_peak_memory_stats``: the peaks restart from now."""
        self.peak_reserved = self.reserved
        self.peak_allocated = self.allocated
