"""Python garbage-collection pauses in the scheduler process, counted for ``/server_info``.

A collection stops every Python thread of the process, the scheduler's included, for as long as
it takes: a collection of the oldest generation (2) walks every tracked object that is not frozen
and can hold the scheduler for tens of milliseconds, long enough to delay every request that
arrives meanwhile. sglang's ``POST /freeze_gc`` moves the objects alive at that moment out of
the collector's reach; what the server allocates afterwards and keeps for a while still reaches
generation 2. The count and the time of these pauses tell an operator whether a slow first
token lines up with one (sglang's own ``SGLANG_LOG_GC=1`` logs every collection instead).

:class:`GcPauses` is a ``gc.callbacks`` entry: it times each collection between its "start" and
"stop" calls and adds it to its generation's count and milliseconds. It runs only when the
interpreter collects, inside whatever set the collection off (about a microsecond a collection,
on a decode step's path when that step's allocations set it off).
"""

from __future__ import annotations

import gc
from time import perf_counter
from typing import Callable, Dict, Optional

GENERATIONS = 3


class GcPauses:
    """Collections and their pause time per generation since :meth:`install`."""

    def __init__(self, clock: Callable[[], float] = perf_counter) -> None:
        self._clock = clock
        self._started: Optional[float] = None
        self.collections = [0] * GENERATIONS
        self.pause_ms = [0.0] * GENERATIONS
        self.longest_ms = 0.0

    def __call__(self, phase: str, info: Dict[str, int]) -> None:
        if phase == "start":
            self._started = self._clock()
            return
        if phase != "stop" or self._started is None:
            return
        ms = 1000.0 * (self._clock() - self._started)
        self._started = None
        generation = min(max(int(info.get("generation", GENERATIONS - 1)), 0), GENERATIONS - 1)
        self.collections[generation] += 1
        self.pause_ms[generation] += ms
        self.longest_ms = max(self.longest_ms, ms)

    def install(self) -> "GcPauses":
        if self not in gc.callbacks:
            gc.callbacks.append(self)
        return self

    def uninstall(self) -> None:
        if self in gc.callbacks:
            gc.callbacks.remove(self)

    def report(self) -> Dict[str, float]:
        """Collections of the oldest generation and their milliseconds, the same for the younger
        ones together, and the longest pause of any."""
        return {
            "gc_gen2_collections": self.collections[2],
            "gc_gen2_pause_ms": round(self.pause_ms[2], 3),
            "gc_young_collections": self.collections[0] + self.collections[1],
            "gc_young_pause_ms": round(self.pause_ms[0] + self.pause_ms[1], 3),
            "gc_longest_pause_ms": round(self.longest_ms, 3),
        }
