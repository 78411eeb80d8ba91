"""A closed-loop streaming load client for the vLLM twin (stdlib asyncio, raw HTTP/1.1).

The field notes' method: `concurrency` users start together; each sends a chat request (prompt of at most
256 tokens, max_tokens=200, streaming), reads the SSE stream to `[DONE]` and immediately sends the next
one. TTFT is the time to the first chunk whose `delta.content` is non-empty (the role-only chunk does not
count, docs/facts/loadtest.md §4); E2E is the time to `[DONE]`; the token count is the stream's
`usage.completion_tokens` (requested with stream_options.include_usage). Latencies are taken over the
requests sent and finished inside the measured window; the generation throughput counts the tokens that
arrived inside it (by the running usage), so requests cut by the window's edges do not bias it.

With a time scale s (VLLM_SIM_TIME_SCALE on the twin), every measured duration is divided by s so the
numbers are in simulated seconds; the same scale applies to the level durations.

    python bench/twin_client.py --url http://127.0.0.1:8000 --model chat-20b --concurrency 32 --seconds 120
"""
from __future__ import annotations

import argparse
import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from typing import List, Optional, Tuple
from urllib.parse import urlparse

# 8 tokens in the twin's tokenizer: the system message of every request (vllm/_twin/calibrate.py).
SYSTEM_PROMPT = "You are a helpful assistant for our users."
WORDS = ("how what why when where can should does the a to of in on for with my our your server model answer "
         "question node queue memory limit cost time data report team user service plan start stop").split()


def field_prompt(rng: random.Random) -> Tuple[str, int]:
    """The user message of one request: as many one-token words as calibrate.field_prompt_tokens draws."""
    if rng.random() < 0.7:
        words = rng.randint(15, 110)
    else:
        words = rng.randint(110, 240)
    return " ".join(rng.choice(WORDS) for _ in range(words)), words


@dataclass
class Window:
    """Tokens that arrived between `start` and `end` (perf_counter): throughput without edge effects."""

    start: float
    end: float
    tokens: int = 0

    def add(self, now: float, count: int) -> None:
        if self.start <= now <= self.end:
            self.tokens += count


@dataclass
class Record:
    sent: float
    ttft: Optional[float] = None
    e2e: Optional[float] = None
    tokens: int = 0
    ok: bool = False
    last_token: Optional[float] = None
    error: Optional[str] = None


@dataclass
class LevelStats:
    concurrency: int
    requests: int
    failures: int
    ttft_p50: float
    ttft_p95: float
    e2e_p50: float
    e2e_p95: float
    throughput: float
    per_stream_decode: float
    per_stream_total: float
    mean_tokens: float
    records: List[Record] = field(default_factory=list, repr=False)


def percentile(values: List[float], q: float) -> float:
    if not values:
        return float("nan")
    data = sorted(values)
    pos = (len(data) - 1) * q / 100.0
    lo = int(pos)
    hi = min(lo + 1, len(data) - 1)
    return data[lo] + (data[hi] - data[lo]) * (pos - lo)


async def _read_chunked_events(reader: asyncio.StreamReader):
    """Yield SSE data payloads from a chunked body; raises on truncation."""
    pending = b""
    while True:
        size_line = await reader.readline()
        if not size_line:
            raise ConnectionError("connection closed inside the chunked body")
        size = int(size_line.split(b";")[0].strip() or b"0", 16)
        if size == 0:
            await reader.readline()
            return
        data = await reader.readexactly(size + 2)
        pending += data[:-2]
        while b"\n\n" in pending:
            event, pending = pending.split(b"\n\n", 1)
            if event.startswith(b"data: "):
                yield event[6:]


async def _one(host: str, port: int, conn: List, body: bytes, scale: float, record: Record,
               window: Optional[Window] = None) -> None:
    if conn[0] is None:
        conn[0] = await asyncio.open_connection(host, port)
    reader, writer = conn[0]
    request = (b"POST /v1/chat/completions HTTP/1.1\r\nHost: twin\r\nContent-Type: application/json\r\n"
               b"Content-Length: %d\r\n\r\n%b" % (len(body), body))
    writer.write(request)
    status = await reader.readline()
    if not status:
        raise ConnectionError("no response")
    chunked = False
    length = 0
    while True:
        line = await reader.readline()
        if line in (b"\r\n", b""):
            break
        name, _, value = line.decode("latin-1").partition(":")
        if name.lower() == "transfer-encoding" and "chunked" in value.lower():
            chunked = True
        if name.lower() == "content-length":
            length = int(value)
    if b" 200 " not in status or not chunked:
        await reader.readexactly(length)
        record.error = status.decode().strip()
        return
    async for payload in _read_chunked_events(reader):
        now = time.perf_counter()
        if payload == b"[DONE]":
            record.e2e = (now - record.sent) / scale
            record.ok = True
            continue
        chunk = json.loads(payload)
        choices = chunk.get("choices") or []
        if choices and choices[0].get("delta", {}).get("content"):
            if record.ttft is None:
                record.ttft = (now - record.sent) / scale
            record.last_token = now
        usage = chunk.get("usage")
        if usage:
            if window is not None and usage["completion_tokens"] > record.tokens:
                window.add(now, usage["completion_tokens"] - record.tokens)
            record.tokens = usage["completion_tokens"]


async def run_level(url: str, model: str, concurrency: int, seconds: float, warmup: float, scale: float,
                    max_tokens: int = 200, seed: int = 1) -> LevelStats:
    """Closed loop: `concurrency` users for warmup + seconds (simulated); stats over the last `seconds`."""
    parsed = urlparse(url)
    host, port = parsed.hostname or "127.0.0.1", parsed.port or 80
    rng = random.Random(seed)
    records: List[Record] = []
    start = time.perf_counter()
    measure_from = start + warmup * scale
    stop_at = measure_from + seconds * scale
    window = Window(measure_from, stop_at)

    async def user() -> None:
        conn: List = [None]
        while time.perf_counter() < stop_at:
            text, _ = field_prompt(rng)
            body = json.dumps({"model": model, "max_tokens": max_tokens, "stream": True,
                               "stream_options": {"include_usage": True},
                               "messages": [{"role": "system", "content": SYSTEM_PROMPT},
                                            {"role": "user", "content": text}]}).encode()
            record = Record(sent=time.perf_counter())
            records.append(record)
            try:
                await _one(host, port, conn, body, scale, record, window)
            except (ConnectionError, asyncio.IncompleteReadError, OSError, ValueError) as exc:
                record.error = f"{type(exc).__name__}: {exc}"
                if conn[0] is not None:
                    conn[0][1].close()
                conn[0] = None
                await asyncio.sleep(0.05 * scale)
        if conn[0] is not None:
            conn[0][1].close()

    await asyncio.gather(*(user() for _ in range(concurrency)))
    tokens_window = window
    window = [r for r in records if r.sent >= measure_from and r.ok and r.sent + r.e2e * scale <= stop_at]
    failures = sum(1 for r in records if r.sent >= measure_from and not r.ok)
    ttft = [r.ttft for r in window if r.ttft is not None]
    e2e = [r.e2e for r in window]
    decode = [(r.tokens - 1) / ((r.last_token - r.sent) / scale - r.ttft) for r in window
              if r.tokens > 1 and r.ttft is not None and (r.last_token - r.sent) / scale > r.ttft]
    throughput = tokens_window.tokens / seconds if seconds else 0.0
    return LevelStats(concurrency=concurrency, requests=len(window), failures=failures,
                      ttft_p50=percentile(ttft, 50), ttft_p95=percentile(ttft, 95), e2e_p50=percentile(e2e, 50),
                      e2e_p95=percentile(e2e, 95), throughput=throughput,
                      per_stream_decode=statistics.fmean(decode) if decode else 0.0,
                      per_stream_total=throughput / concurrency,
                      mean_tokens=statistics.fmean([r.tokens for r in window]) if window else 0.0, records=window)


async def warm_up(url: str, model: str, requests: int, scale: float) -> None:
    """The field notes' warm-up: ~20 ordinary requests after a cold start (failure 5)."""
    parsed = urlparse(url)
    rng = random.Random(99)
    for _ in range(requests):
        text, _ = field_prompt(rng)
        body = json.dumps({"model": model, "max_tokens": 16, "stream": True,
                           "messages": [{"role": "user", "content": text}]}).encode()
        conn: List = [None]
        await _one(parsed.hostname or "127.0.0.1", parsed.port or 80, conn, body, scale, Record(time.perf_counter()))
        conn[0][1].close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--model", required=True)
    parser.add_argument("--concurrency", type=int, nargs="+", default=[8, 16, 32, 64])
    parser.add_argument("--seconds", type=float, default=120.0, help="measured simulated seconds per level")
    parser.add_argument("--warmup", type=float, default=30.0, help="simulated seconds discarded per level")
    parser.add_argument("--time-scale", type=float, default=1.0, help="the twin's VLLM_SIM_TIME_SCALE")
    args = parser.parse_args()
    asyncio.run(warm_up(args.url, args.model, 20, args.time_scale))
    for concurrency in args.concurrency:
        stats = asyncio.run(run_level(args.url, args.model, concurrency, args.seconds, args.warmup, args.time_scale))
        print(json.dumps({k: v for k, v in stats.__dict__.items() if k != "records"}))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
