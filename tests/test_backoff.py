"""The one backoff formula and the loop companion built on it."""

from phoenix.backoff import Backoff, delay


def test_delay_doubles_from_the_base_up_to_the_cap() -> None:
    assert [delay(n, 0.1, 1.0) for n in range(6)] == [0.1, 0.2, 0.4, 0.8, 1.0, 1.0]


def test_delay_stays_at_the_cap_for_any_attempt() -> None:
    assert delay(10**6, 5.0, 120.0) == 120.0


def test_a_loop_waits_longer_after_each_failure_and_starts_over_after_a_success() -> None:
    backoff = Backoff(0.5, 10.0)
    assert [backoff.failed() for _ in range(6)] == [0.5, 1.0, 2.0, 4.0, 8.0, 10.0]
    backoff.succeeded()
    assert backoff.failed() == 0.5
