"""`BetweenSteps`: work a step hands to a thread of its own, done while the model's forward runs."""

import queue
import threading
import time


class BetweenSteps:
    """A thread that runs a step's queued calls (finished requests filed into memory, rows' new tokens
    indexed) between that step and the next.

    `submit(fn, *args)` queues a call after a step's drafts are returned; `wait`, at the start of
    the next step, returns once every queued call has run. So a step always reads what the calls
    write as if they had run at the end of the step before, whatever the thread's timing: the
    drafts are the same as without the thread. A queued call holds its arguments (the arrays a
    kernel reads among them) until it has run. A call's error is raised by the next `wait` (or `close`).
    `close` runs what is queued, ends the thread and joins it; the owner closes it (LookupProposer
    does so on close, when collected, and at interpreter exit). `seconds`: the thread's time in calls.

    Example:
        >>> worker, seen = BetweenSteps(), []
        >>> worker.submit(seen.append, 1)
        >>> worker.wait(); seen
        [1]
        >>> worker.close(); worker.alive
        False
    """

    def __init__(self):
        self.seconds = 0.0
        self._queue: queue.Queue = queue.Queue()
        self._thread: threading.Thread | None = None  # started by the first submit
        self._error: BaseException | None = None
        self._closed = False

    @property
    def alive(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def submit(self, fn, *args) -> None:
        if self._closed:
            raise RuntimeError("lookahead: this proposer was closed; its thread takes no more work")
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="lookahead-between-steps", daemon=True)
            self._thread.start()
        self._queue.put((fn, args))

    def _run(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:  # close's sentinel: everything before it has run
                self._queue.task_done()
                return
            fn, args = item
            start = time.perf_counter()
            try:
                fn(*args)
            except BaseException as error:  # the thread lives on; the step that waits raises it
                self._error = error
            finally:
                del fn, args, item  # what the call held goes now, not at the next call
                self.seconds += time.perf_counter() - start
                self._queue.task_done()

    def wait(self) -> None:
        if self._queue.unfinished_tasks:  # (an int read: a step that queued nothing pays no Condition)
            self._queue.join()
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def close(self) -> None:
        """Runs what is queued, then ends and joins the thread; a queued call's error is raised here."""
        if self._closed:
            return
        self._closed = True
        if self._thread is not None:
            self._queue.put(None)
            self._thread.join()
        self.wait()
