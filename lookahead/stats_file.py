"""`StatsFile`: a dict of counters written as JSON to a file by a thread of its own, at most once a
second and at exit, so that a serving loop's step pays an Event's set for it (the vLLM proposer's counters use it)."""

import atexit
import json
import os
import threading
import weakref

STATS_INTERVAL_S = 1.0  # the file is rewritten at most this often (and at exit)


class StatsFile:
    """Writes `snapshot()` (a dict) as JSON to `path`, atomically, at most every STATS_INTERVAL_S and at exit.

    `changed()` is all a step pays; a daemon thread writes the file within STATS_INTERVAL_S of
    the last change, holding `lock` (the owner's step lock, so that a file never shows half a step).
    The owner closes it (`close`: a last write, the thread joined); at interpreter exit it closes itself.

    Example:
        >>> import os, tempfile, threading
        >>> path = os.path.join(tempfile.mkdtemp(), "stats.json")
        >>> counters = {"steps": 0}
        >>> stats_file = StatsFile(path, lambda: dict(counters), threading.Lock())
        >>> counters["steps"] = 3; stats_file.changed()
        >>> stats_file.close(); open(path).read()
        '{"steps": 3}'
    """

    def __init__(self, path: str, snapshot, lock: threading.Lock):
        self.path = path
        self._snapshot = snapshot
        self._lock = lock
        self._dirty = threading.Event()
        self._closing = threading.Event()
        self._closed = False
        self._thread = threading.Thread(target=self._run, name="lookahead-stats", daemon=True)
        self._thread.start()
        atexit.register(_close, weakref.ref(self))

    def changed(self) -> None:
        self._dirty.set()

    def _run(self) -> None:
        while not self._closed:
            self._dirty.wait()
            if self._closed:
                return
            self._dirty.clear()
            self.write()
            self._closing.wait(STATS_INTERVAL_S)  # at most one write per interval (close cuts the wait)

    def write(self) -> None:
        with self._lock:
            content = json.dumps(self._snapshot())
        temporary = f"{self.path}.{os.getpid()}.tmp"
        with open(temporary, "w") as f:
            f.write(content)
        os.replace(temporary, self.path)

    def close(self) -> None:
        """Writes the last counters and joins the thread; no writes after."""
        if not self._closed:
            self._closed = True
            self._closing.set()
            self._dirty.set()  # wakes the thread to end
            if self._thread is not threading.current_thread():
                self._thread.join()
            self.write()


def _close(ref) -> None:
    stats_file = ref()
    if stats_file is not None:
        stats_file.close()
