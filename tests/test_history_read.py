"""HistoryReadGuard without Redis: which entries a lane's history read must not start again."""

from __future__ import annotations

from phoenix.worker_runtime.history_read import HistoryReadGuard
from phoenix.worker_runtime.outcomes import Disposition, Outcome


def _outcome(entry_id: str, disposition: Disposition = Disposition.COMMIT) -> Outcome:
    return Outcome(disposition, entry_id, "r", holds_lock=disposition is not Disposition.SKIP)


def test_an_entry_handed_over_without_a_flight_is_passed_by_until_it_is_settled() -> None:
    guard = HistoryReadGuard()
    guard.handed_over("1-0")
    assert "1-0" in guard.settling_without_flight and "2-0" not in guard.settling_without_flight
    guard.settled([_outcome("2-0")])
    assert "1-0" in guard.settling_without_flight
    guard.settled([_outcome("1-0", Disposition.SKIP)])
    assert not guard.settling_without_flight


def test_entries_settled_during_a_read_are_told_to_it_but_a_leave_is_not() -> None:
    guard = HistoryReadGuard()
    guard.settled([_outcome("0-1")])  # before the read: not its concern
    with guard.reading() as settled:
        guard.settled([_outcome("1-0"), _outcome("2-0", Disposition.LEAVE), _outcome("3-0", Disposition.RETRY)])
    assert settled == {"1-0", "3-0"}  # a left entry is still pending: reading it again is what a leave is for
    guard.settled([_outcome("4-0")])  # after the read
    assert settled == {"1-0", "3-0"}


def test_a_read_that_fails_stops_collecting() -> None:
    guard = HistoryReadGuard()
    try:
        with guard.reading():
            raise ConnectionError("the read failed")
    except ConnectionError:
        pass
    with guard.reading() as settled:
        pass
    guard.settled([_outcome("1-0")])
    assert settled == set()
