"""Running test workers in threads so that a worker's exception fails the test (not just a warning)."""

import threading


def start_threads(*workers):
    """Starts one daemon thread per callable; returns (the exceptions they raise, a function that joins them)."""
    errors = []

    def guarded(worker):
        try:
            worker()
        except BaseException as e:  # noqa: BLE001 - every failure must reach the test
            errors.append(e)

    threads = [threading.Thread(target=guarded, args=(w,), daemon=True) for w in workers]
    for t in threads:
        t.start()
    return errors, lambda: [t.join() for t in threads]


def run_in_threads(*workers) -> None:
    """Runs each callable in its own thread, joins them all, re-raises the first exception any raised."""
    errors, join = start_threads(*workers)
    join()
    if errors:
        raise errors[0]
