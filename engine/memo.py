"""Every cache of the engine in one registry, and one way to empty them all: :func:`clear`.

The engine memoises pure functions of its frozen specs with :func:`cached`, and keeps a
few caches by hand in a :class:`Table` where the key is derived from the arguments (a
strategy without its shape, an object's identity). Each registers here under its
qualified name (``memfit.engine.estimate._prepared``, ``memfit.engine.steptime._MEMOS``), so that
:func:`clear` reaches every one: for checks that an answer does not depend on what was
computed before it, for benchmarks that time a rebuild, and after the files a preset was
read from change.

Threads: the app runs the engine from several worker threads at once.

* :func:`cached` is :func:`functools.lru_cache` itself, registered: a hit costs what an
  ``lru_cache`` hit costs, one call of its C wrapper. That wrapper keeps its own dict and
  recency list coherent when threads call it at once (every update holds the interpreter
  lock, and a result that another thread stored while this one computed is not stored
  twice); under a race the function may run twice, and each caller gets an equal answer.
* A :class:`Table` reads as a dict (``get``, ``in``: the dict's own, no lock); it stores
  under a lock, the first entry stored for a key stays (a thread that computed the same
  answer meanwhile gets the stored one, so that threads share one object), and it
  empties itself when it holds ``maxsize`` entries.
* :func:`register` takes the clear function of any other cache.

A cache must be keyed by everything its result depends on: a whole frozen spec, or a key
derived from the dataclass's fields (:func:`memfit.engine.timeline.strategy_key`), never a
hand-picked subset of them.
"""

from __future__ import annotations

import functools
import threading
from collections.abc import Callable, Hashable
from dataclasses import dataclass
from typing import TypeVar

K = TypeVar("K", bound=Hashable)
V = TypeVar("V")
T = TypeVar("T")


@dataclass(frozen=True, slots=True)
class _Entry:
    """One registered cache: how to empty it and how many entries it holds."""

    clear: Callable[[], None]
    size: Callable[[], int]


_LOCK = threading.Lock()
_REGISTRY: dict[str, _Entry] = {}


def register(name: str, clear: Callable[[], None], size: Callable[[], int]) -> None:
    """Register a cache under ``name`` (``module.attribute``): ``clear`` empties it,
    ``size`` counts its entries. A name registered again (a module reloaded) is
    replaced."""
    with _LOCK:
        _REGISTRY[name] = _Entry(clear, size)


def cached(
    maxsize: int | None = 128,
) -> Callable[[Callable[..., T]], functools._lru_cache_wrapper[T]]:
    """:func:`functools.lru_cache` of ``maxsize`` entries (``None``: unbounded), registered
    under the function's qualified name. The function must be pure: its result depends on
    its arguments alone, and every argument is hashable."""

    def wrap(function: Callable[..., T]) -> functools._lru_cache_wrapper[T]:
        wrapper = functools.lru_cache(maxsize=maxsize)(function)
        register(
            f"{function.__module__}.{function.__qualname__}",
            wrapper.cache_clear,
            lambda: wrapper.cache_info().currsize,
        )
        return wrapper

    return wrap


class Table(dict[K, V]):
    """A cache kept by hand: a dict, read as a dict (no lock), that stores through
    :meth:`keep` (and counts through :meth:`tally`) under its lock, and empties itself
    when it holds ``maxsize`` entries. ``name`` registers it (``module.attribute``); a
    table inside another registered cache goes with it and has none."""

    __slots__ = ("_lock", "maxsize")

    def __init__(self, name: str | None, maxsize: int) -> None:
        super().__init__()
        self.maxsize = maxsize
        self._lock = threading.Lock()
        if name is not None:
            register(name, self.clear, self.__len__)

    def keep(self, key: K, value: V) -> V:
        """The entry for ``key``: the one stored already, else ``value``, stored now."""
        with self._lock:  # one hash of the key where the table has room (keys are long)
            if len(self) >= self.maxsize and key not in self:
                dict.clear(self)
            return self.setdefault(key, value)

    def tally(self: Table[K, int], key: K) -> int:
        """One more count for ``key``; the count, this one included."""
        with self._lock:
            count = self.get(key, 0) + 1
            if count == 1 and len(self) >= self.maxsize:
                dict.clear(self)
            self[key] = count
            return count

    def clear(self) -> None:
        with self._lock:
            dict.clear(self)


def _selected(names: tuple[str, ...]) -> list[_Entry]:
    with _LOCK:
        if not names:
            return list(_REGISTRY.values())
        chosen: dict[str, _Entry] = {}
        for name in names:
            found = {
                key: entry
                for key, entry in _REGISTRY.items()
                if key == name or key.startswith(name + ".")
            }
            if not found:
                raise ValueError(f"no engine cache is called {name!r}")
            chosen.update(found)
        return list(chosen.values())


def clear(*names: str) -> None:
    """Empty every cache of the engine; or, given names, the caches so named and every
    cache of a module so named (``clear("memfit.engine.batch")``). A name that matches none is
    a :class:`ValueError`. A computation that runs in another thread meanwhile may store
    its answer after the clear (every cached function is pure: the answer is right)."""
    for entry in _selected(names):
        entry.clear()


def sizes() -> dict[str, int]:
    """How many entries each registered cache holds, by name."""
    with _LOCK:
        entries = dict(_REGISTRY)
    return {name: entry.size() for name, entry in sorted(entries.items())}


def registered() -> dict[str, Callable[[], None]]:
    """The clear function of each registered cache, by name: :func:`cached` functions by
    their ``cache_clear``, tables by their ``clear``."""
    with _LOCK:
        return {name: entry.clear for name, entry in _REGISTRY.items()}
