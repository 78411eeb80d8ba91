#!/usr/bin/python3
"""Run a command - an ansible-playbook - and interrupt it the way a controller dies, or break something under it
(issue 17 §4).

The signal goes to the command's whole process group, as a terminal sends an operator's Ctrl-C (`--signal INT`)
and as a killed controller loses every process at once (`--signal KILL`: the playbook and its forks, and with them
the SSH sessions they hold; what already runs on a host goes on there). It is sent as soon as a condition holds:
a regular expression found in a URL's body (`--url`/`--regex`: the front door's Prometheus exporter says a server's
state; it lists every state of a server, with 1 for the one it is in and 0 for the others, so the regex names the
value) or a command that succeeds (`--until-cmd`, run through the shell: a file or a unit on a lab host). The
command's output goes to `--log`. A Ctrl-C that the command has not ended on within `--again` seconds is pressed
again, as an operator would: ansible-playbook takes SIGINT in a handler that puts the default action back and raises
KeyboardInterrupt in its main thread, and what is raised while that thread runs a finalizer (a generator's close, an
object's __del__) or dispatches a worker's inventory call (which catches BaseException) is dropped - the run then
goes on as if nothing was pressed (stop 36's CI: the roll ran to its end, exit 0; docs/faults.md §1). The second
Ctrl-C meets the default action and ends the process (exit -2), as it does at a terminal. With `--signal NONE`
nothing is sent: `--then-cmd` runs through the shell when the condition holds (a fault under the run: a lab host's
link cut) and the command runs to its end. Prints one JSON object: {signal, condition, seconds (from the start to
the signal or the fault), rc (the command's exit status; -9 for SIGKILL, -2 for a second Ctrl-C), sigints (how
many were sent), then_rc (the fault command's, or null), ended_first, timed_out}.

Exit status: 0 the command was interrupted (or the fault made) as asked; 3 it ended before the condition held
(nothing was interrupted: the check that uses this would prove nothing); 4 the condition did not hold within
`--timeout`, or the command did not end within it (the command is killed); 5 after SIGINT it did not end within
`--grace` seconds (then it is killed); 6 the fault command failed (the command still runs to its end).

    interrupt.py --signal INT --url http://10.213.0.14:8405/metrics --regex 'server="node2-vllm-0",state="MAINT"} 1$' \\
        --log run.log -- ansible-playbook -i inventory rolling.yml
"""
from __future__ import annotations

import argparse
import json
import os
import re
import signal
import subprocess
import sys
import time
import urllib.request
from typing import List, Optional, Tuple

# --signal: INT (Ctrl-C, pressed again while the command goes on), KILL, or NONE (a fault under the run)
SIGNALS = ("INT", "KILL", "NONE")


def url_matches(url: str, pattern: "re.Pattern[str]") -> bool:
    """Whether the body of a GET of `url` matches; an unreachable URL (HAProxy not installed yet) does not."""
    try:
        with urllib.request.urlopen(url, timeout=2) as answer:  # noqa: S310 - a lab host's address, given
            return bool(pattern.search(answer.read().decode("utf-8", "replace")))
    except (OSError, ValueError):
        return False


def command_status(command: str) -> int:
    """The shell command's exit status; 124 when it ran past 20 s."""
    try:
        return subprocess.run(command, shell=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,  # noqa: S602
                              timeout=20, check=False).returncode
    except subprocess.TimeoutExpired:
        return 124


def command_succeeds(command: str) -> bool:
    return command_status(command) == 0


def interrupt_until_ended(process: subprocess.Popen, grace: float, again: float) -> Tuple[int, int]:
    """Ctrl-C to the process group, again every `again` seconds it has not ended, SIGKILL after `grace` seconds:
    (SIGINTs sent, 0 - or 5 when it had to be killed)."""
    deadline, sent = time.monotonic() + grace, 0
    while True:
        os.killpg(process.pid, signal.SIGINT)
        sent += 1
        try:
            process.wait(timeout=max(0.0, min(again, deadline - time.monotonic())))
            return sent, 0
        except subprocess.TimeoutExpired:
            if time.monotonic() >= deadline:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                return sent, 5


def main(argv: Optional[List[str]] = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--signal", choices=SIGNALS, required=True)
    parser.add_argument("--url", help="poll this URL ...")
    parser.add_argument("--regex", help="... until its body matches this (multi-line)")
    parser.add_argument("--until-cmd", help="or poll this shell command until it exits 0")
    parser.add_argument("--interval", type=float, default=0.2, help="seconds between polls")
    parser.add_argument("--timeout", type=float, default=900, help="seconds to wait for the condition")
    parser.add_argument("--grace", type=float, default=120, help="seconds the command may take to end after SIGINT")
    parser.add_argument("--again", type=float, default=5,
                        help="seconds after a SIGINT the command has not ended on before another is sent")
    parser.add_argument("--then-cmd", help="with --signal NONE: the shell command run when the condition holds")
    parser.add_argument("--log", required=True, help="where the command's stdout and stderr go")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- COMMAND ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    if bool(args.url) != bool(args.regex) or bool(args.url) == bool(args.until_cmd):
        parser.error("give either --url with --regex, or --until-cmd")
    if (args.signal == "NONE") != bool(args.then_cmd):
        parser.error("--then-cmd goes with --signal NONE, and only with it")
    if args.url:
        pattern = re.compile(args.regex, re.MULTILINE)
        condition, holds = f"{args.url} matches {args.regex}", lambda: url_matches(args.url, pattern)
    else:
        condition, holds = f"`{args.until_cmd}` succeeds", lambda: command_succeeds(args.until_cmd)

    started = time.monotonic()
    result = {"signal": args.signal, "condition": condition, "seconds": None, "rc": None, "sigints": 0,
              "then_rc": None, "ended_first": False, "timed_out": False}
    status = 0
    os.makedirs(os.path.dirname(os.path.abspath(args.log)), exist_ok=True)
    with open(args.log, "wb") as log:
        process = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, start_new_session=True)
        while process.poll() is None and not holds():
            if time.monotonic() - started > args.timeout:
                result["timed_out"], status = True, 4
                break
            time.sleep(args.interval)
        if process.poll() is not None:
            result["ended_first"], status = True, 3
        elif status == 0 and args.signal == "NONE":
            result["seconds"] = round(time.monotonic() - started, 1)
            result["then_rc"] = command_status(args.then_cmd)
            status = 0 if result["then_rc"] == 0 else 6
            try:
                process.wait(timeout=max(1.0, args.timeout - (time.monotonic() - started)))
            except subprocess.TimeoutExpired:
                os.killpg(process.pid, signal.SIGKILL)
                process.wait()
                result["timed_out"], status = True, 4
        elif status == 4 or args.signal == "KILL":
            result["seconds"] = round(time.monotonic() - started, 1)
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        else:
            result["seconds"] = round(time.monotonic() - started, 1)
            result["sigints"], status = interrupt_until_ended(process, args.grace, args.again)
    result["rc"] = process.returncode
    print(json.dumps(result))
    return status


if __name__ == "__main__":
    sys.exit(main())
