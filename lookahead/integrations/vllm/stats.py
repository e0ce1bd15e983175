"""The proposer's counters (`ProposerStats`), written to options["stats_path"] by lookahead.stats_file.StatsFile."""

from dataclasses import asdict, dataclass, field


@dataclass
class ProposerStats:
    """Counters of one proposer (one worker); drafts/draft_tokens/accepted_* count as vLLM's metrics do."""

    steps: int = 0
    requests: int = 0  # requests seen
    finished: int = 0  # requests finished (their tokens filed into memory)
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


def stats_dict(stats: ProposerStats, runner) -> dict:
    return dict(asdict(stats), runner=type(runner).__name__ if runner is not None else None)
