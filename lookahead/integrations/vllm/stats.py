"""The proposer's counters (`ProposerStats`) and their file (`StatsFile`: at most once a second, and at exit)."""

import atexit
import json
import os
import threading
import weakref
from dataclasses import asdict, dataclass, field

STATS_INTERVAL_S = 1.0  # the counters file is rewritten at most this often (and at exit)


@dataclass
class ProposerStats:
    """Counters of one proposer (one worker); drafts/draft_tokens/accepted_* count as vLLM's metrics do."""

    steps: int = 0
    requests: int = 0  # requests seen
    finished: int = 0  # requests retired (their tokens filed into memory)
    drafts: int = 0  # non-empty drafts verified, vLLM's own included
    draft_tokens: int = 0
    accepted_tokens: int = 0
    accepted_per_pos: list = field(default_factory=list)
    rows_by_content: int = 0  # rows identified by content (no runner)
    vllm_drafts: int = 0  # of those, drafts vLLM made itself (its placeholders or zeros)
    discarded_drafts: int = 0  # drafts vLLM dropped unverified (a preempted request, a step without room or without us)
    cut_tokens: int = 0  # drafted tokens the load rule did not send
    skipped_steps: int = 0  # steps the load rule drafted nothing for without drafting (no token could pay)
    withheld_steps: int = 0  # steps whose drafts were made but not sent (not worth sizing.load.MIN_GAIN of tokens per second)
    memory_tokens: int = 0
    fixed_cost_tokens: float = 0.0  # the load rule's current F / p
    draft_cost_tokens: float = 0.0  # the load rule's extra cost of a step that verifies drafts, in verified tokens
    propose_s: float = 0.0  # time in propose, all rows


class StatsFile:
    """Writes `snapshot()` (a dict) as JSON to `path`, atomically, at most every STATS_INTERVAL_S and at exit.

    `changed()` is all a step pays; a daemon thread writes the file within STATS_INTERVAL_S of
    the last change, holding `lock` (the proposer's, so that a file never shows half a step).
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


def stats_dict(stats: ProposerStats, runner) -> dict:
    return dict(asdict(stats), runner=type(runner).__name__ if runner is not None else None)
