"""What a lane's history read (XREADGROUP from a cursor: its own pending entries again) must pass by.

A history read returns every entry still pending on this consumer, including ones the worker has already dealt
with but not yet acknowledged. Entries in flight are known by the lane's flights; this guards against the two
cases nothing else tells apart:

- an entry handed to the settler without ever being in flight (an intake dead letter, a duplicate): until its
  settle, a history read would take it a second time;
- an entry settled while the read was on its way: Redis may have answered the read before the settle, and once
  settled the entry is in flight no more, so without this the read would start it again.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from phoenix.worker_runtime.outcomes import Disposition, Outcome


class HistoryReadGuard:
    """One lane's entries a history read must not start again (see the module docstring)."""

    __slots__ = ("_settled_during_read", "settling_without_flight")

    def __init__(self) -> None:
        # Read by the intake for every entry it reads (a set, not a method call, on the hot path); changed only here.
        self.settling_without_flight: set[str] = set()
        self._settled_during_read: set[str] | None = None

    def handed_over(self, entry_id: str) -> None:
        """The entry went to the settler without being in flight: a read skips it until it is settled."""
        self.settling_without_flight.add(entry_id)

    def settled(self, batch: Sequence[Outcome]) -> None:
        """A batch is durable: its entries are no longer on their way, and one read meanwhile must skip them,
        but for a leave (still pending: reading it again is what a leave is for)."""
        reading = self._settled_during_read
        if reading is None and not self.settling_without_flight:
            return  # the usual case: nothing to do for the batch
        discard, leave = self.settling_without_flight.discard, Disposition.LEAVE
        for outcome in batch:
            discard(outcome.entry_id)
            if reading is not None and outcome.disposition is not leave:
                reading.add(outcome.entry_id)

    @contextmanager
    def reading(self) -> Iterator[set[str]]:
        """Around a history read: yields the entries settled while it runs, to be left out of what it returned."""
        self._settled_during_read = settled = set[str]()
        try:
            yield settled
        finally:
            self._settled_during_read = None
