"""Where (c)'s time goes: the `phoenix worker` of `make bench` (no-op `process()`) profiled while it drains its input.

- the worker: py-spy samples it from its first commit to its last (a flame graph, or py-spy's other formats);
- Redis: every command's time per message (INFO commandstats, nested script commands counted on their own too),
  and each script's time per record it handled, from SLOWLOG (every call logged: slowlog-log-slower-than 0; the
  records of a call are its record keys, KEYS minus the script's fixed ones).

The input is larger than `make bench`'s so that the profile has enough samples, hence OUTPUT_HIGH_WATER=0 (the
output has no reader here, and the intake would pause at its mark). py-spy comes with the dev extra.
"""

from __future__ import annotations

import argparse
import asyncio
import hashlib
import shutil
import signal
import sys
from collections import defaultdict
from pathlib import Path

import redis.asyncio as aioredis

from bench.worker_throughput import (
    INPUT,
    OUTPUT,
    VARIANTS,
    bench_stage,
    cpu_times,
    fill,
    start_worker,
    worker_env,
)
from phoenix import lua
from phoenix.embedded import embedded_valkey

# The scripts of the hot path and how many of their KEYS are not record keys (settle.lua: the lane's four, for a
# stage without named outputs).
SCRIPTS = {"locks_acquire.lua": 0, "settle.lua": 4}
_RUNTIME = "phoenix.worker_runtime"


def script_costs(slowlog: list[dict[str, object]]) -> dict[str, tuple[int, int, float]]:
    """Per script of SCRIPTS: calls, records and microseconds per record, from SLOWLOG's EVALSHA entries."""
    names = {hashlib.sha1(lua.source(name, _RUNTIME).encode()).hexdigest(): name for name in SCRIPTS}
    calls: dict[str, int] = defaultdict(int)
    records: dict[str, int] = defaultdict(int)
    micros: dict[str, int] = defaultdict(int)
    for entry in slowlog:
        command = [a.decode() if isinstance(a, bytes) else str(a) for a in entry["command"].split()]  # type: ignore[attr-defined]
        if len(command) < 3 or command[0].upper() != "EVALSHA" or command[1] not in names:
            continue
        name = names[command[1]]
        calls[name] += 1
        records[name] += int(command[2]) - SCRIPTS[name]
        micros[name] += int(entry["duration"])  # type: ignore[call-overload]
    return {name: (calls[name], records[name], micros[name] / max(records[name], 1)) for name in calls}


async def profile(n: int, concurrency: int, log_level: str, output: Path, fmt: str, rate: int) -> int:
    spy = shutil.which("py-spy", path=str(Path(sys.executable).parent)) or shutil.which("py-spy")
    if spy is None:
        print("py-spy not found: pip install -e '.[dev]'", file=sys.stderr)
        return 2
    with embedded_valkey() as url:
        client = aioredis.Redis.from_url(url)
        await fill(client, INPUT, n)
        await client.config_set("slowlog-log-slower-than", 0)
        await client.config_set("slowlog-max-len", 1_000_000)
        processor, _ = VARIANTS["process"]
        env = worker_env(url, "bench", processor, concurrency, log_level, bench_stage({"OUTPUT_HIGH_WATER": "0"}))
        worker = await start_worker(env)
        try:
            while not await client.xlen(OUTPUT):
                await asyncio.sleep(0.001)
            await client.config_resetstat()
            await client.slowlog_reset()
            user, system = cpu_times(worker.pid)
            recorder = await asyncio.create_subprocess_exec(
                spy, "record", "--pid", str(worker.pid), "--rate", str(rate), "--format", fmt, "-o", str(output),
                "--nonblocking", stdout=asyncio.subprocess.DEVNULL,
            )  # fmt: skip
            while (done := await client.xlen(OUTPUT)) < n:
                if worker.returncode is not None:
                    raise RuntimeError(f"phoenix worker exited with {worker.returncode}")
                await asyncio.sleep(0.05)
            user, system = (end - start for end, start in zip(cpu_times(worker.pid), (user, system), strict=True))
            recorder.send_signal(signal.SIGINT)  # py-spy writes its output and exits
            await recorder.wait()
            stats = await client.info("commandstats")
            slowlog = await client.slowlog_get(-1)
        finally:
            worker.terminate()
            await worker.wait()
            await client.aclose()
    print(f"CONCURRENCY={concurrency}, LOG_LEVEL={log_level}: {done:,} messages, profile in {output}")
    # py-spy counts a thread's wall time in a call, preempted or not: the kernel's share of the worker's own CPU
    # says how much of a socket write's samples is work (system) rather than waiting for a core.
    print(f"Worker CPU per message: {(user + system) / done * 1e6:.1f} us (user {user / done * 1e6:.1f}, "
          f"system {system / done * 1e6:.1f}), py-spy's sampling included")  # fmt: skip
    print("Redis commands, microseconds per message (a script's own commands are counted in it and on their own):")
    for name, stat in sorted(stats.items(), key=lambda item: -item[1]["usec"]):
        if stat["usec"] / done >= 0.01:
            print(f"  {name.removeprefix('cmdstat_'):<14} {stat['usec'] / done:7.2f}  ({stat['calls']:,} calls)")
    print("Scripts, microseconds per record (SLOWLOG):")
    for name, (calls, records, per_record) in script_costs(slowlog).items():
        print(f"  {name:<18} {per_record:7.2f}  ({calls:,} calls, {records / calls:.0f} records a call)")
    return 0


def main() -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--messages", type=int, default=60_000)
    p.add_argument("--concurrency", type=int, default=1000)
    p.add_argument("--log-level", default="warning", choices=["debug", "info", "warning", "error"])
    p.add_argument("--format", default="flamegraph", choices=["flamegraph", "raw", "speedscope"], help="py-spy's")
    p.add_argument("--rate", type=int, default=250, help="py-spy's samples a second")
    p.add_argument("-o", "--output", type=Path, required=True)
    args = p.parse_args()
    return asyncio.run(profile(args.messages, args.concurrency, args.log_level, args.output, args.format, args.rate))


if __name__ == "__main__":
    sys.exit(main())
