"""Independent estimates side by side, one forked process each, as many at once as there are cores.

An estimate is one Python thread of fake-tensor dispatch: a second core does nothing for it. The
batch search, the one-command table and ``advise`` each know several estimates they will need
before they need them (the two neighbours of a predicted batch, every row of a table, every
single change), so :func:`prefetch` runs those in forked children, each with a copy of the
parent's model and plan, and hands back what they return. A child that fails (or a platform
without ``fork``) leaves its result out: the caller then runs that estimate itself, in process,
where its error is raised as it would have been. Results come back pickled; the figures are
those of the same estimate run in process (the children run the same code on the same inputs).
"""

from __future__ import annotations

import os
import pickle
import selectors
import sys
from collections.abc import Callable, Sequence
from typing import Any, TypeVar

T = TypeVar("T")

ENV = "MEMPROFILER_JOBS"
"""Environment variable: how many estimates run at once (``1``: one after another, in process)."""


def default_jobs() -> int:
    """``MEMPROFILER_JOBS`` when set, else the cores this process may run on."""
    value = os.environ.get(ENV, "").strip()
    if value:
        try:
            return max(1, int(value))
        except ValueError:
            return 1
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not Linux
        return max(1, os.cpu_count() or 1)


_warm = False
"""Whether this process has run an estimate itself: torch's caches an estimate fills are filled."""


def warmed() -> None:
    """Note that this process has run an estimate (the engine calls it after each)."""
    global _warm
    _warm = True


def prefetch(
    tasks: Sequence[Callable[[], T]],
    jobs: int | None = None,
    *,
    here_first: bool = False,
    then: Callable[[int, T | None], Sequence[Callable[[], T]]] | None = None,
) -> list[T | None]:
    """Each task's result in order, run in forked children, ``jobs`` at a time (default
    :func:`default_jobs`); ``None`` where a task failed or nothing was run (one task, one job,
    no ``fork``): the caller runs those itself.

    ``then(index, result)`` is called here as each task ends, in the order they end; the tasks it
    returns run next, before those still waiting, and their results follow in the list in the
    order given (a search asks for its next estimate as soon as the last one it needs is in,
    while the cores stay busy with the rest). ``here_first``: the first task runs here even in a
    process that has run an estimate (what it records in this process is wanted here).

    Until this process has run an estimate itself, the first task runs here, beside ``jobs - 1``
    children forked before it: torch's caches that an estimate fills (the fake tensors' dispatch
    cache, DTensor's sharding propagation, transformers' lazy imports) are then the later
    children's too. A second estimate of a 7B FSDP2 step in one process took 12.7 s of CPU
    where the first took 18.4 s.
    """
    jobs = default_jobs() if jobs is None else jobs
    if len(tasks) < 2 or jobs < 2 or not hasattr(os, "fork"):
        return [None] * len(tasks)
    results: list[Any] = [None] * len(tasks)
    pending = list(enumerate(tasks))
    here = pending.pop(0) if here_first or not _warm else None
    running: dict[int, tuple[int, int, list[bytes]]] = {}  # fd -> (index, pid, chunks)
    sel = selectors.DefaultSelector()
    sys.stdout.flush()
    sys.stderr.flush()

    def ended(index: int, result: Any) -> None:
        results[index] = result
        if then is not None:
            more = list(then(index, result))
            pending[:0] = [(len(results) + i, task) for i, task in enumerate(more)]
            results.extend([None] * len(more))

    def start_children(slots: int) -> None:
        while pending and len(running) < slots:
            index, task = pending.pop(0)
            fd, pid = _start(task)
            running[fd] = (index, pid, [])
            sel.register(fd, selectors.EVENT_READ)

    try:
        if here is not None:  # the other cores start cold beside it; later children start warm
            start_children(jobs - 1)
            try:
                result = here[1]()
            except Exception:
                result = None
            ended(here[0], result)
        while pending or running:
            start_children(jobs)
            for key, _ in sel.select():
                fd = int(key.fd)
                index, pid, chunks = running[fd]
                data = os.read(fd, 1 << 20)
                if data:
                    chunks.append(data)
                    continue
                sel.unregister(fd)
                os.close(fd)
                del running[fd]
                _, status = os.waitpid(pid, 0)
                ended(index, _loaded(b"".join(chunks)) if status == 0 else None)
    finally:
        for fd, (_, pid, _) in running.items():  # interrupted: no child outlives the call
            sel.unregister(fd)
            os.close(fd)
            _stop(pid)
        sel.close()
    return results


def _start(task: Callable[[], Any]) -> tuple[int, int]:
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: run, write the pickled result, leave without cleanup
        code = 1
        try:
            os.close(read)
            # GNU OpenMP's thread team does not survive a fork: a parallel region the parent ran
            # leaves the child waiting at its barrier for threads that are not there. One thread
            # keeps torch's CPU kernels (the real values some fake ops compute) off OpenMP.
            torch = sys.modules.get("torch")
            if torch is not None:
                torch.set_num_threads(1)
            # fresh streams: a lock the parent's threads held at the fork would never be released here
            sys.stdout = open(os.devnull, "w")  # noqa: SIM115
            sys.stderr = os.fdopen(os.dup(2), "w")
            payload = pickle.dumps(task(), protocol=pickle.HIGHEST_PROTOCOL)
            with os.fdopen(write, "wb") as out:
                out.write(payload)
            code = 0
        except BaseException:
            code = 1
        finally:
            os._exit(code)
    os.close(write)
    return read, pid


def _loaded(data: bytes) -> Any:
    try:
        return pickle.loads(data)
    except Exception:
        return None


def _stop(pid: int) -> None:
    import signal

    try:
        os.kill(pid, signal.SIGKILL)
        os.waitpid(pid, 0)
    except OSError:
        pass
