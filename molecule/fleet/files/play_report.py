#!/usr/bin/python3
"""Run one ansible-playbook with the JSON callback (ansible.posix.json) and print a short form of its report: the
stats, and per play and task the name and each host's failed/changed/skipped/unreachable and msg - what the
scenario's assertions read. The full report goes to --full (kept in the scenario's ephemeral directory for a
failure's post-mortem): a roll's report is megabytes, and templating it into Ansible variables step after step
cost the scenario a minute. Exits with ansible-playbook's code; its stderr passes through.

    play_report.py --full FILE -- ansible-playbook ARGS...
"""
import argparse
import json
import os
import subprocess
import sys

KEPT = ("failed", "changed", "skipped", "unreachable", "msg")


def short(report):
    """The report with only what the assertions read (see KEPT)."""
    return {
        "stats": report.get("stats", {}),
        "plays": [
            {
                "play": {"name": play["play"].get("name", "")},
                "tasks": [
                    {
                        "task": {"name": task["task"].get("name", "")},
                        "hosts": {
                            host: {key: result[key] for key in KEPT if key in result}
                            for host, result in task.get("hosts", {}).items()
                        },
                    }
                    for task in play.get("tasks", [])
                ],
            }
            for play in report.get("plays", [])
        ],
    }


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--full", required=True, help="where the full JSON report goes")
    parser.add_argument("command", nargs=argparse.REMAINDER, help="-- ansible-playbook ARGS...")
    args = parser.parse_args(argv)
    command = args.command[1:] if args.command[:1] == ["--"] else args.command
    if not command:
        parser.error("no command after --")
    env = dict(os.environ, ANSIBLE_LOAD_CALLBACK_PLUGINS="1", ANSIBLE_STDOUT_CALLBACK="ansible.posix.json")
    # The JSON callback must be stdout's only writer: a callback the caller enabled (profile_tasks, timer) prints
    # its lines into the same stream and the report no longer parses.
    for name in ("ANSIBLE_CALLBACKS_ENABLED", "ANSIBLE_CALLBACK_WHITELIST"):
        env.pop(name, None)
    done = subprocess.run(command, env=env, stdout=subprocess.PIPE, text=True, check=False)
    os.makedirs(os.path.dirname(os.path.abspath(args.full)), exist_ok=True)
    with open(args.full, "w", encoding="utf-8") as out:
        out.write(done.stdout)
    try:
        report = json.loads(done.stdout)
    except ValueError:
        sys.stderr.write(f"no JSON report from {command[0]} (exit {done.returncode}): {done.stdout[-2000:]}\n")
        return done.returncode or 1
    json.dump(short(report), sys.stdout)
    return done.returncode


if __name__ == "__main__":
    sys.exit(main())
