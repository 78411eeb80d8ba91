"""Tensor-parallel worker processes: 0.5.4's mp executor forks TP-1 `VllmWorkerProcess` children.

The twin's workers compute nothing; they exist so the process tree, signals and deaths behave as in
0.5.4: under systemd's default KillMode=control-group every worker gets the SIGTERM too, and when a
worker dies the executor's WorkerMonitor logs it, kills the other workers and the engine is dead
(v0.5.4 vllm/executor/multiproc_worker_utils.py:98-135). A worker exits when its parent goes away.
"""
from __future__ import annotations

import asyncio
import os
import signal
from typing import Callable, List, Optional


class WorkerSet:
    def __init__(self) -> None:
        self.pids: List[int] = []
        self._death_fds: List[int] = []
        self._alive_w: List[int] = []
        self.on_death: Optional[Callable[[int, int], None]] = None
        self.closing = False

    def spawn(self, count: int) -> List[int]:
        for _ in range(count):
            alive_r, alive_w = os.pipe()     # parent holds the write end; EOF tells the worker to go
            death_r, death_w = os.pipe()     # the worker holds the write end; EOF tells the parent it died
            pid = os.fork()
            if pid == 0:
                os.close(alive_w)
                os.close(death_r)
                for inherited in self._alive_w + self._death_fds:
                    os.close(inherited)
                signal.signal(signal.SIGINT, signal.SIG_IGN)
                signal.signal(signal.SIGTERM, signal.SIG_DFL)
                try:
                    while os.read(alive_r, 1):
                        pass
                finally:
                    os._exit(0)
            os.close(alive_r)
            os.close(death_w)
            self.pids.append(pid)
            self._alive_w.append(alive_w)
            self._death_fds.append(death_r)
        return list(self.pids)

    def watch(self, on_death: Callable[[int, int], None]) -> None:
        """Call on_death(pid, exit_code) from the event loop when a worker dies (negative = signal)."""
        self.on_death = on_death
        loop = asyncio.get_running_loop()
        for pid, fd in zip(self.pids, self._death_fds):
            loop.add_reader(fd, self._died, pid, fd)

    def _died(self, pid: int, fd: int) -> None:
        loop = asyncio.get_running_loop()
        loop.remove_reader(fd)
        try:
            _, status = os.waitpid(pid, 0)
            code = -os.WTERMSIG(status) if os.WIFSIGNALED(status) else os.WEXITSTATUS(status)
        except ChildProcessError:
            code = 0
        if pid in self.pids:
            self.pids.remove(pid)
        if self.on_death is not None and not self.closing:
            self.on_death(pid, code)

    def kill_all(self) -> None:
        self.closing = True
        for pid in list(self.pids):
            try:
                os.kill(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        for fd in self._alive_w:
            try:
                os.close(fd)
            except OSError:
                pass
        self._alive_w = []
