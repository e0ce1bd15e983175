"""Which request each row of vLLM's persistent batch holds: the runner's request ids, found on the stack.

vLLM's proposer interface passes no request ids: rows move (condensed, swapped, reused by new
requests) and nothing is called when a request finishes. The model runner holds them
(`input_batch.req_ids[row]`, `num_prompt_tokens[row]`, the live `requests`); `find_runner`
finds it among load_model's callers. Without it, rows are matched to requests by content.
"""

RUNNER_SEARCH_FRAMES = 8  # load_model's callers searched for the runner (vLLM 0.32/0.33: frame 1; a wrapping proposer: 2)


def find_runner(frame, *, max_frames: int = RUNNER_SEARCH_FRAMES):
    """vLLM's model runner: the first `self` owning a persistent batch (`input_batch` and `requests`)
    among `frame` and its callers, at most `max_frames` of them; None when there is none.

    The runner calls the proposer's load_model itself (vLLM 0.32, 0.33), or through a class
    that wraps the proposer; either way it is a few frames up, and it is the only object
    there holding both attributes.
    """
    for _ in range(max_frames):
        if frame is None:
            return None
        candidate = frame.f_locals.get("self")
        if hasattr(candidate, "input_batch") and hasattr(candidate, "requests"):
            return candidate
        frame = frame.f_back
    return None
