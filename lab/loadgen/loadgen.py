#!/usr/bin/python3
"""Closed-loop load through the front door, counting every request a client would call failed (lab tooling).

Runs on the bench host with the system python3 and `revive_sse.py` (module_utils/revive_sse.py) beside it.
`--concurrency` clients each send a streamed chat request, read it to the end, wait `--think-time` seconds and
send the next one (a closed loop), until `--stop-file` exists or `--duration` seconds passed; then the requests in flight finish and the summary is
written as JSON. A request fails when the answer is not HTTP 200, is cut (a truncated chunked body), lacks
`data: [DONE]` or a finish_reason, or has no text or usage (docs/facts/lb-and-rolling.md §4.1): the client never
retries, so nothing the front door lets through is hidden. The summary's `timeline` counts the answers and failures
by the second their request was sent (seconds after `started_at`, the Unix time the load began), so that a fault's
effect can be placed against when it happened (molecule/frontdoor_ha: failures before the address moved, none after).

With `--tls` it speaks https to the front door and verifies its certificate and the host name (an IP address against
the certificate's IP SANs) against `--ca-file`, else the system's trust store; never unverified. The API key comes
from `--api-key-file` (or $REVIVE_API_KEY), so that it is not in argv, which every user of the host can read.

    loadgen.py --host 10.0.0.4 --tls --ca-file /etc/revive/ca.pem --api-key-file /run/revive-api-key \
               --model tiny-chat --concurrency 8 --max-tokens 64 --stop-file /run/loadgen.stop \
               --out /var/tmp/loadgen.json
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import threading
import time
from typing import Dict, List, Optional

# Deployed: the module_utils file lies beside this script; in the repository it is ../../module_utils.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "module_utils"))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

from revive_sse import CAFileError, Endpoint, StreamRequest, stream, tls_context  # noqa: E402

PROMPTS = (
    "Explain in two sentences what a rolling update is.",
    "Write a short haiku about load balancers.",
    "List three causes of high latency in a web service.",
    "What is the difference between a queue and a stack?",
    "Summarise why health checks can be misleading, briefly.",
    "Give one tip for writing clear commit messages.",
)
FAILURES_KEPT = 50


def percentile(values: List[float], fraction: float) -> Optional[float]:
    if not values:
        return None
    ordered = sorted(values)
    return round(ordered[min(len(ordered) - 1, int(round(fraction * (len(ordered) - 1))))], 4)


class Load:
    def __init__(self, args: argparse.Namespace):
        self.args = args
        self.endpoint = Endpoint(args.host, args.port, args.api_key, timeout=args.request_timeout, tls=args.tls,
                                 ca_file=args.ca_file)
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.started = time.time()
        self.sent = 0
        self.ok = 0
        self.failed = 0
        self.truncated = 0
        self.no_done = 0
        self.http_errors: Dict[str, int] = {}
        self.failures: List[dict] = []
        self.timeline: Dict[int, List[int]] = {}
        self.by_server: Dict[str, int] = {}
        self.ttft: List[float] = []
        self.e2e: List[float] = []

    def should_stop(self) -> bool:
        if self.args.stop_file and os.path.exists(self.args.stop_file):
            return True
        return bool(self.args.duration) and time.time() - self.started >= self.args.duration

    def client(self, number: int) -> None:
        sequence = number
        # --ramp-up: client i starts i/concurrency of it late, so that the clients' requests do not stay in step
        # (with equal answers they would all be in flight, or all between requests, at the same moments)
        if self.args.ramp_up and self.stop.wait(self.args.ramp_up * number / self.args.concurrency):
            return
        while not self.stop.is_set():
            request = StreamRequest(self.args.kind, self.args.model, max_tokens=self.args.max_tokens,
                                    temperature=0.7,
                                    messages=[{"role": "user", "content": PROMPTS[sequence % len(PROMPTS)]}],
                                    prompt=PROMPTS[sequence % len(PROMPTS)],
                                    extra={"ignore_eos": True} if self.args.ignore_eos else {})
            sequence += self.args.concurrency
            if self.args.think_time and self.stop.wait(self.args.think_time):
                break
            sent_at = time.time()
            result = stream(self.endpoint, request)
            server = result.headers.get(self.args.served_by_header.lower(), "")
            with self.lock:
                self.sent += 1
                self.by_server[server or "(none)"] = self.by_server.get(server or "(none)", 0) + 1
                self.timeline.setdefault(int(sent_at - self.started), [0, 0])[0 if result.ok else 1] += 1
                if result.ok:
                    self.ok += 1
                    self.ttft.append(result.ttft_s or 0.0)
                    self.e2e.append(result.e2e_s or 0.0)
                else:
                    self.failed += 1
                    self.truncated += int(result.truncated)
                    self.no_done += int(not result.done)
                    if result.status and result.status != 200:
                        self.http_errors[str(result.status)] = self.http_errors.get(str(result.status), 0) + 1
                    if len(self.failures) < FAILURES_KEPT:
                        self.failures.append({"sent_at": round(sent_at - self.started, 3), "server": server,
                                              "status": result.status, "truncated": result.truncated,
                                              "error": result.error()})

    def run(self) -> dict:
        clients = [threading.Thread(target=self.client, args=(i,), daemon=True) for i in range(self.args.concurrency)]
        for thread in clients:
            thread.start()
        while not self.should_stop():
            time.sleep(0.2)
        self.stop.set()
        for thread in clients:
            thread.join()
        return self.summary()

    def summary(self) -> dict:
        return {"host": self.args.host, "port": self.args.port, "tls": self.args.tls,
                "concurrency": self.args.concurrency,
                "think_time_s": self.args.think_time, "ramp_up_s": self.args.ramp_up,
                "max_tokens": self.args.max_tokens, "ignore_eos": self.args.ignore_eos,
                "started_at": round(self.started, 3), "duration_s": round(time.time() - self.started, 2),
                "sent": self.sent, "ok": self.ok, "failed": self.failed, "truncated": self.truncated,
                "without_done": self.no_done, "http_errors": self.http_errors, "by_server": self.by_server,
                "ttft_s": {"p50": percentile(self.ttft, 0.5), "p95": percentile(self.ttft, 0.95)},
                "e2e_s": {"p50": percentile(self.e2e, 0.5), "p95": percentile(self.e2e, 0.95),
                          "mean": round(statistics.fmean(self.e2e), 4) if self.e2e else None},
                "failures": self.failures,
                "timeline": [[second, *counts] for second, counts in sorted(self.timeline.items())]}


def parse(argv: List[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--host", required=True)
    parser.add_argument("--port", type=int, help="default: 443 with --tls, else 80")
    parser.add_argument("--tls", action="store_true", help="https, the server's certificate verified")
    parser.add_argument("--ca-file", default="", metavar="PATH",
                        help="with --tls: CA certificate(s) (PEM) to verify the front door with; default: the "
                             "system's trust store")
    parser.add_argument("--model", required=True)
    key = parser.add_mutually_exclusive_group()
    key.add_argument("--api-key-file", metavar="PATH", help="read the bearer token from this file (stripped)")
    key.add_argument("--api-key", default=os.environ.get("REVIVE_API_KEY", ""),
                     help="the bearer token itself (default: $REVIVE_API_KEY); shows in argv (ps, /proc): prefer "
                          "--api-key-file or the environment")
    parser.add_argument("--kind", choices=["chat", "completions"], default="chat")
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--max-tokens", type=int, default=64)
    parser.add_argument("--ignore-eos", action="store_true",
                        help="vLLM's ignore_eos sampling parameter: every answer runs to --max-tokens")
    parser.add_argument("--think-time", type=float, default=0.0, help="seconds between a client's requests")
    parser.add_argument("--ramp-up", type=float, default=0.0, metavar="S",
                        help="start the clients spread over S seconds (client i after i/concurrency of S), so that "
                             "they are not in step; default 0: all at once")
    parser.add_argument("--request-timeout", type=float, default=120.0)
    parser.add_argument("--duration", type=float, default=0.0, help="seconds; 0 = until --stop-file exists")
    parser.add_argument("--stop-file", default="")
    parser.add_argument("--served-by-header", default="X-Revive-Server")
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    if not args.duration and not args.stop_file:
        parser.error("give --duration or --stop-file")
    if args.port is None:
        args.port = 443 if args.tls else 80
    if args.ca_file and not args.tls:
        parser.error("argument --ca-file: it verifies a TLS front door; give --tls as well")
    if args.tls:
        try:
            tls_context(args.ca_file)   # a bad CA file stops here, not in every client thread
        except CAFileError as exc:
            parser.error(f"argument --ca-file: {exc}")
    if args.api_key_file:
        try:
            with open(args.api_key_file, encoding="utf-8") as handle:
                args.api_key = handle.read().strip()
        except OSError as exc:
            parser.error(f"argument --api-key-file: {args.api_key_file}: {exc.strerror or exc}")
        if not args.api_key:
            parser.error(f"argument --api-key-file: {args.api_key_file} holds no key")
    return args


def main(argv: List[str]) -> int:
    args = parse(argv)
    summary = Load(args).run()
    temporary = args.out + ".tmp"
    with open(temporary, "w", encoding="utf-8") as out:
        json.dump(summary, out, indent=1)
    os.replace(temporary, args.out)
    print(json.dumps({k: summary[k] for k in ("sent", "ok", "failed", "truncated", "by_server")}))
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
