"""The intake: the one way work comes in, and what it does before a processor is called.

Per lane: its own pending entries first (at start, after a broken connection), the idle entries of dead workers
whenever a claim is due (every CLAIM_INTERVAL, and at start so a replacement pod picks up its predecessor's work),
else new entries. Each read goes into slots reserved beforehand (`Slots`: at most CONCURRENCY records between read
and settle), and its entries are screened (malformed, poison: straight to the settler), claimed (one locks script
for the batch) and handed to the worker to start (`start`).
"""

from __future__ import annotations

import asyncio
import contextlib
import time
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass, field

import structlog
from redis.asyncio import Redis
from redis.exceptions import RedisError, ResponseError

from phoenix.backoff import Backoff
from phoenix.keys import StageKeys
from phoenix.worker_runtime import metrics
from phoenix.worker_runtime.backpressure import Backpressure
from phoenix.worker_runtime.circuit_breaker import CircuitBreaker
from phoenix.worker_runtime.history_read import HistoryReadGuard
from phoenix.worker_runtime.locks import Claim, RecordLocks
from phoenix.worker_runtime.messages import Message
from phoenix.worker_runtime.outcomes import Outcome, RecordPolicy, Unprocessable, error_line
from phoenix.worker_runtime.rate_limit import RateLimiter
from phoenix.worker_runtime.reclaim import Reclaimer
from phoenix.worker_runtime.redis_client import Entry, read_group, read_groups
from phoenix.worker_runtime.settings import REDIS_RETRY_MAX_DELAY, WorkerSettings
from phoenix.worker_runtime.settle import Settler, refused_by_item
from phoenix.worker_runtime.tracing import MessageTracing

log = structlog.get_logger("phoenix.worker")

# Reads stay small enough that the next batch is read and claimed while earlier ones are processed and
# settled: Redis and Python then work at the same time instead of taking turns. Hence also at most half of
# CONCURRENCY per read: with one read filling every slot, the next read would wait for its whole settle.
_READ_BATCH = 200
# A partitioned stage on Redis Cluster waits for new entries on one lane at a time (a read is single-slot): this long,
# so an entry arriving on another lane waits for it at most.
_LANE_BLOCK_MS = 100


@dataclass(slots=True)
class InFlight:
    """A message whose lock this worker holds, from claim to settle."""

    message: Message
    deadline: float  # monotonic; the watchdog cancels the processor call past it (PROCESSING_TIMEOUT)
    lane: int = 0
    task: asyncio.Task[None] | None = None
    timed_out: bool = False
    # Its outcome went to the settler: once only, so a call given up past its timeout cannot commit when it ends.
    submitted: bool = False


@dataclass(slots=True, eq=False)
class Lane:
    """The intake state of one partition of the stage: its input's cursor and history reads, its idle claims."""

    index: int
    keys: StageKeys
    reclaimer: Reclaimer
    cursor: str = "0"
    reread_own_pending: bool = True  # at start: own pending entries first (id 0), then new ones (>)
    next_claim: float = 0.0  # monotonic; at start a claim is due, so a replacement pod picks up its predecessor's work
    in_flight: dict[str, InFlight] = field(default_factory=dict)
    history: HistoryReadGuard = field(default_factory=HistoryReadGuard)  # what a history read must pass by


class Slots:
    """CONCURRENCY: at most that many records between read and settle. The intake reserves slots before a read and
    gives back what the read did not use; a settle frees the slots of its records."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self.used = 0
        self._freed = asyncio.Event()

    async def reserve(self, limit: int) -> int:
        """Reserve up to `limit` slots, waiting briefly for one; 0 if none freed up (the caller loops)."""
        if self.capacity - self.used <= 0:
            self._freed.clear()
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._freed.wait(), 1.0)
        n = max(0, min(limit, self.capacity - self.used))
        self.used += n
        return n

    def release(self, n: int) -> None:
        if n:
            self.used -= n
            self._freed.set()


class Intake:
    """Reads, screens and claims each lane's entries into the worker's slots, and starts what it claimed.

    `start` runs the processor over a read's claimed flights (the worker's); `ensure_group` recreates a stream or
    group deleted under it; `route` gives it the settler and backpressure of where the lanes' commits forward.
    `last_beat` is the intake's last sign of health for /healthz: an iteration whose Redis calls returned, or that
    waited on purpose.
    """

    def __init__(
        self,
        settings: WorkerSettings,
        client: Redis,
        lanes: list[Lane],
        *,
        policy: RecordPolicy,
        locks: RecordLocks,
        breaker: CircuitBreaker,
        tracing: MessageTracing,
        slots: Slots,
        stopping: asyncio.Event,
        start: Callable[[list[InFlight]], None],
        ensure_group: Callable[[], Awaitable[None]],
        limiter: RateLimiter | None = None,
    ) -> None:
        self.settings = settings
        self.redis = client
        self.lanes = lanes
        self.policy = policy
        self.locks = locks
        self.breaker = breaker
        self._tracing = tracing
        self._slots = slots
        self._stopping = stopping
        self._start = start
        self._ensure_group = ensure_group
        self._limiter = limiter
        self._lane_of_stream = {lane.keys.input.encode(): lane for lane in lanes}
        self._turn = 0  # the lane whose turn it is to read
        self._turn_started = 0  # entries the current intake turn started (each holds a slot until settled)
        # READ_MEMORY_BYTES: a read asks for no more entries of MAX_MESSAGE_BYTES than fit in it (docs/durability.md).
        by_memory = settings.read_memory_bytes // settings.max_message_bytes
        self._read_batch = max(1, min(_READ_BATCH, (settings.concurrency + 1) // 2, by_memory))
        self.last_beat = time.monotonic()
        stage = settings.service_name
        self._m_reclaimed = metrics.RECLAIMED.labels(stage)
        self._m_contention = metrics.LOCK_CONTENTION.labels(stage)

    def route(self, settler: Settler, backpressure: Backpressure, *, slots_matter: bool) -> None:
        """Where entries settled without a flight go, what holds a lane back, and whether a read is single-slot."""
        self.settler = settler
        self.backpressure = backpressure
        self._slots_matter = slots_matter

    def reread_own_pending(self) -> None:
        """Every lane reads its own pending entries again before new ones."""
        for lane in self.lanes:
            lane.reread_own_pending = True

    async def run(self) -> None:
        """The one way work comes in: per lane, own pending entries first, idle entries of dead workers whenever a
        claim is due (every CLAIM_INTERVAL, and at start so a replacement pod picks up its predecessor's work), else
        new entries. Whatever the source, it is read into slots reserved beforehand, so CONCURRENCY holds."""
        backoff = Backoff(0.1, REDIS_RETRY_MAX_DELAY)
        failed = False
        while not self._stopping.is_set():
            if not failed:  # a read Redis keeps not answering (a socket timeout, retried) is no beat
                self.last_beat = time.monotonic()
            failed = False
            trial_slots = self.breaker.trial_slots()
            if trial_slots == 0:
                # Open, or all half-open trials running: pull no new work until the breaker lets calls through.
                await asyncio.sleep(min(1.0, self.breaker.seconds_until_half_open() or 0.2))
                continue
            if self.backpressure.holds_all:
                # What every lane feeds is over OUTPUT_HIGH_WATER: read nothing until the next stage catches up.
                await self.backpressure.wait_resumed(1.0)
                continue
            n = await self._slots.reserve(
                self._read_batch if trial_slots is None else min(self._read_batch, trial_slots)
            )
            if n == 0:
                continue
            self._turn_started = 0
            try:
                await self._intake_turn(n)
                backoff.succeeded()
            except RedisError as exc:
                if isinstance(exc, ResponseError) and "NOGROUP" in str(exc):
                    # Someone deleted the stream or group (a stage reset): recreate it and go on.
                    with contextlib.suppress(RedisError):
                        await self._ensure_group()
                    continue
                # Redis down, or the key is not a stream: say so and keep trying, never crash-loop.
                # Redis not answering, or refusing every call for now (a read-only replica after a failover): no
                # beat. An error about the call itself (the key is no stream) is an answer; a restart cannot cure it.
                failed = not refused_by_item(exc)
                wait = backoff.failed()
                log.warning("redis_read_failed", error=str(exc), retry_in=wait)
                if not isinstance(exc, ResponseError):
                    # A broken connection (a failover): a read may have delivered entries whose reply never came,
                    # or the claim after a read failed. They are pending on this consumer: read them again first,
                    # as at start, instead of leaving them to a reclaim after CLAIM_IDLE_MS.
                    self.reread_own_pending()
                await asyncio.sleep(wait)
            except Exception as exc:  # a bug one entry met past the screen: never the end of the intake
                failed = True  # no beat: a turn that keeps failing fails /healthz
                wait = backoff.failed()
                log.error("intake_turn_failed", error=error_line(exc), retry_in=wait)
                # Its entries are pending on us: read again, each read counting a delivery up to MAX_DELIVERIES.
                self.reread_own_pending()
                await asyncio.sleep(wait)
            finally:
                self._slots.release(n - self._turn_started)

    async def _intake_turn(self, n: int) -> None:
        """Read into `n` reserved slots: the lanes take turns (a busy lane reads once per round, so it cannot
        starve another), and the first lane with something to do uses the turn. With one lane the read of new
        entries blocks (BLOCK_MS); with several they are read without blocking, and only when no lane had any
        does the worker wait for the first new entry (_wait_for_new)."""
        s, all_lanes = self.settings, self.lanes
        single = len(all_lanes) == 1
        for _ in all_lanes:
            lane = all_lanes[self._turn]
            self._turn = (self._turn + 1) % len(all_lanes)
            if self.backpressure.holds(lane.index):
                continue  # the partition of the output it feeds is over its mark
            if lane.reread_own_pending:
                lane.reread_own_pending, lane.cursor = False, "0"
            if lane.cursor != ">":
                lane.cursor = await self._read_history(lane, n)
                return
            if time.monotonic() >= lane.next_claim:
                if await self._claim_idle(lane, n):
                    lane.next_claim = time.monotonic() + s.claim_interval
                return
            block = s.block_ms if single else None
            new = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, ">", n, block)
            if new or single:
                await self._dispatch(lane, new, None)
                return
        await self._wait_for_new(n)

    async def _wait_for_new(self, n: int) -> None:
        """Every lane not held by backpressure was empty: block until new entries come. On a single Redis one
        XREADGROUP waits on every such lane at once (n // lanes entries of each at most, so CONCURRENCY holds); on a
        cluster, or with fewer slots than lanes, one lane waits _LANE_BLOCK_MS, the next lane next time."""
        s, all_lanes, backpressure = self.settings, self.lanes, self.backpressure
        open_lanes = [lane for lane in all_lanes if not backpressure.holds(lane.index)]
        if not open_lanes:
            return  # held since the turn began: the intake loop waits for a resume
        if not self._slots_matter and n >= len(open_lanes):
            streams = [lane.keys.input for lane in open_lanes]
            count = n // len(open_lanes)
            for stream, entries in await read_groups(
                self.redis, s.consumer_group, s.consumer_name, streams, count, s.block_ms
            ):
                await self._dispatch(self._lane_of_stream[stream], entries, None)
            return
        while backpressure.holds((lane := all_lanes[self._turn]).index):
            self._turn = (self._turn + 1) % len(all_lanes)
        self._turn = (self._turn + 1) % len(all_lanes)
        block = min(s.block_ms, _LANE_BLOCK_MS)
        new = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, ">", n, block)
        await self._dispatch(lane, new, None)

    async def _read_history(self, lane: Lane, n: int) -> str:
        """XREADGROUP of the lane's own pending entries from its cursor; returns the next cursor (">" once all were
        read again: from then on only new entries)."""
        s = self.settings
        with lane.history.reading() as settled:
            entries = await read_group(self.redis, s.consumer_group, s.consumer_name, lane.keys.input, lane.cursor, n)
            if not entries:
                return ">"
            counts = await lane.reclaimer.delivery_counts([e[0].decode() for e in entries])
        unsettled = [e for e in entries if e[0].decode() not in settled]
        await self._dispatch(lane, unsettled, counts)
        return entries[-1][0].decode()

    async def _claim_idle(self, lane: Lane, n: int) -> bool:
        """XAUTOCLAIM a slice of the lane's idle entries. Returns whether its whole pending list was walked."""
        entries, trimmed = await lane.reclaimer.claim(n)
        if trimmed:  # XAUTOCLAIM acknowledged them
            self.policy.trimmed(trimmed)
        if entries:
            self._m_reclaimed.inc(len(entries))
            log.warning("stale_messages_claimed", count=len(entries), idle_ms=self.settings.claim_idle_ms)
            counts = await lane.reclaimer.delivery_counts([e[0].decode() for e in entries])
            await self._dispatch(lane, entries, counts)
        if not lane.reclaimer.exhausted:
            return False
        gone = await lane.reclaimer.forget_dead_consumers()
        if gone:
            log.info("dead_consumers_removed", consumers=gone)
        return True

    async def _dispatch(self, lane: Lane, entries: Sequence[Entry], counts: dict[str, int] | None) -> None:
        """Parse, poison-check, claim and start entries of `lane`; adds how many now hold a slot until settled to
        the turn's count.

        Every Redis call comes before anything is started, so an error here leaves no slot taken.
        """
        s, policy = self.settings, self.policy
        in_flight, settling = lane.in_flight, lane.history.settling_without_flight
        candidates: list[Message] = []
        unfit: list[Unprocessable] = []
        trimmed: list[str] = []
        for raw_id, raw in entries:
            entry_id = raw_id.decode()
            if entry_id in in_flight or entry_id in settling:
                continue  # our own unsettled entry seen again in a history read
            if raw is None:
                trimmed.append(entry_id)  # trimmed from the stream while pending: nothing left to process
                continue
            screened = policy.screen(entry_id, raw, counts.get(entry_id, 1) if counts else 1)
            if isinstance(screened, Unprocessable):
                unfit.append(screened)
            else:
                candidates.append(screened)
        if trimmed:
            await self.redis.xack(lane.keys.input, s.consumer_group, *trimmed)
            policy.trimmed(len(trimmed))
        refused = await self.locks.acquire(candidates, lane.keys) if candidates else {}
        for entry in unfit:
            self._settle_without_flight(lane, policy.unprocessable(entry))
        skipped = 0
        for index, claim in refused.items():
            message = candidates[index]
            if claim == Claim.DUPLICATE:
                skipped += 1
                skip = policy.duplicate(message)
                if self._tracing.recording:
                    self._tracing.duplicate(message, skip)
                self._settle_without_flight(lane, skip)
            elif claim == Claim.KEY_OF_ANOTHER_TYPE:
                skipped += 1
                key = lane.keys.record_prefix + message.record_id
                reason = (
                    f"its record key {key} holds no lock or marker (a key of another type, written by something else "
                    "than the runtime): delete the key, then reprocess the record"
                )
                unusable = Unprocessable(message.entry_id, message.raw, reason, "RecordKeyConflict", 1)
                self._settle_without_flight(lane, policy.unprocessable(unusable))
            else:
                self._m_contention.inc()
                log.info("record_locked_elsewhere", record_id=message.record_id, message_id=message.entry_id)
        acquired = [m for index, m in enumerate(candidates) if index not in refused] if refused else candidates
        held = 0  # expired or throttled: settled without a flight, each holding its slot until then
        if acquired:
            # Past its deadline or MAX_RECORD_AGE, a claimed record is dead-lettered before its processor call and
            # before its user's key is fetched: nothing is done, nothing billed.
            now_ms = round(time.time() * 1000)
            fresh = []
            for message in acquired:
                if (outcome := policy.expired(message, now_ms)) is None:
                    fresh.append(message)
                else:
                    held += 1
                    self._settle_without_flight(lane, outcome)
            acquired = fresh
        waits = await self._limiter.admit(acquired) if acquired and self._limiter is not None else None
        now = time.monotonic()
        deadline = now + s.processing_timeout
        index = lane.index
        flights: list[InFlight] = []
        reserved: list[tuple[InFlight, float]] = []
        for n, message in enumerate(acquired):
            wait = waits[n] if waits is not None else 0
            if wait < 0:  # a rate limit holds it back past HOLD_MS: the retry set, due when its limit has room
                held += 1
                self._settle_without_flight(lane, policy.throttled(message, -wait))
                continue
            flight = InFlight(message, deadline + wait / 1000, index)
            in_flight[message.entry_id] = flight
            if wait:
                reserved.append((flight, wait / 1000))
            else:
                flights.append(flight)
        self._turn_started += len(unfit) + skipped + held + len(flights) + len(reserved)  # a slot each until settled
        if flights:
            self._start(flights)
        loop = asyncio.get_running_loop()
        for flight, delay in reserved:  # its rate limits' units reserved: started when their time comes
            loop.call_later(delay, self._start_reserved, flight)

    def _start_reserved(self, flight: InFlight) -> None:
        """A reserved record's time came; unless a shutdown gave it up meanwhile (left pending), it starts."""
        if not flight.submitted and not self._stopping.is_set():
            self._start([flight])

    def _settle_without_flight(self, lane: Lane, outcome: Outcome) -> None:
        """Hand the settler an entry that never was in flight; until settled, a history read passes it by."""
        lane.history.handed_over(outcome.entry_id)
        outcome.lane = lane.index
        self.settler.submit(outcome)
