"""The vLLM proposer's memory over many requests, driven through vLLM's interface alone.

The proposer is built as vLLM builds it (the class from a config), `load_model` is called from a
runner object holding a persistent batch (as vLLM's GPU and CPU model runners do), and every step
is one `propose` call. Requests against a document library above `select_above_tokens`
(each consults the documents its prompt selects), memory off (the shared store grows to its cap
by design), `--concurrency` at a time, each prompted with 64 tokens of a document and finishing
after `--steps` decode steps that copy the document on. Prints the process's resident memory and
the Python heap (tracemalloc) after each checkpoint of requests served.

    python benchmarks/vllm_memory.py --requests 100,1000,10000 --library-tokens 100000
"""

import argparse
import gc
import resource
import time
import tracemalloc
from pathlib import Path
from tempfile import TemporaryDirectory
from types import SimpleNamespace

import numpy as np

from lookahead import DocumentLibrary
from lookahead.integrations.vllm import LookupProposer


class Runner:
    """What the proposer reads of vLLM's model runner: the persistent batch and the live requests."""

    def __init__(self, proposer, rows: int, max_len: int):
        self.input_batch = SimpleNamespace(req_ids=[], num_prompt_tokens=np.zeros(rows, dtype=np.int32),
                                           spec_token_ids=[], token_ids_cpu=np.zeros((rows, max_len), dtype=np.int32))
        self.requests = {}
        proposer.load_model(object())  # finds this runner one frame up, as it finds vLLM's

    def step(self, proposer, rows, drafts):
        """rows: (request id, tokens, prompt length) per row; drafts: what each row's step verified."""
        batch = self.input_batch
        batch.req_ids = [key for key, _, _ in rows]
        batch.spec_token_ids = drafts
        num_tokens = np.zeros(len(rows), dtype=np.int32)
        for r, (_, tokens, prompt_len) in enumerate(rows):
            batch.token_ids_cpu[r, : len(tokens)] = tokens
            batch.num_prompt_tokens[r] = prompt_len
            num_tokens[r] = len(tokens)
        self.requests = {key: None for key in batch.req_ids}
        return proposer.propose([tokens[-1:] for _, tokens, _ in rows], num_tokens, batch.token_ids_cpu)


def resident_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * resource.getpagesize() / 2**20


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--requests", default="100,1000,10000", help="checkpoints: requests served")
    parser.add_argument("--library-tokens", type=int, default=100_000)
    parser.add_argument("--document-tokens", type=int, default=200)
    parser.add_argument("--concurrency", type=int, default=16)
    parser.add_argument("--steps", type=int, default=4, help="decode steps per request")
    args = parser.parse_args()
    checkpoints = sorted(int(n) for n in args.requests.split(","))
    rng = np.random.default_rng(0)
    docs = [rng.integers(100, 30_000, size=args.document_tokens).tolist() for _ in range(args.library_tokens // args.document_tokens)]
    with TemporaryDirectory() as folder:
        library = DocumentLibrary()
        for doc in docs:
            library.add(doc)
        library.save(Path(folder) / "documents.npz")
        config = SimpleNamespace(
            speculative_config=SimpleNamespace(num_speculative_tokens=8),
            model_config=SimpleNamespace(max_model_len=1024, hf_config=SimpleNamespace(eos_token_id=None)),
            scheduler_config=SimpleNamespace(max_num_seqs=args.concurrency),
            additional_config={"lookahead": {"memory": False, "documents_path": str(Path(folder) / "documents.npz")}})
        proposer = LookupProposer(config)
    runner = Runner(proposer, args.concurrency, 1024)
    tracemalloc.start()
    served, start = 0, time.perf_counter()
    print(f"library: {len(docs)} documents, {args.library_tokens} tokens; {args.concurrency} requests at a time, "
          f"{args.steps} decode steps each; memory off")
    print("| requests served | resident MB | Python heap MB (tracemalloc) | seconds |")
    print("|---|---|---|---|")
    for checkpoint in checkpoints:
        while served < checkpoint:
            group = range(served, min(served + args.concurrency, checkpoint))
            live = {f"r{i}": list(docs[i % len(docs)][:64]) for i in group}
            drafts = [[] for _ in live]
            for _ in range(args.steps):
                rows = [(key, tokens, 64) for key, tokens in live.items()]
                out = runner.step(proposer, rows, drafts)
                drafts = []
                for (key, tokens, _), draft in zip(rows, out):
                    doc = docs[int(key[1:]) % len(docs)]
                    kept = 0
                    while kept < len(draft) and len(tokens) + kept < len(doc) and draft[kept] == doc[len(tokens) + kept]:
                        kept += 1
                    tokens.extend(doc[len(tokens) : len(tokens) + kept + 1])
                    drafts.append(draft)
            served = group.stop
        runner.step(proposer, [("idle", [1, 2, 3], 3)], [[]])  # the group's requests left: retired at this step
        gc.collect()
        print(f"| {served} | {resident_mb():.1f} | {tracemalloc.get_traced_memory()[0] / 2**20:.2f} | {time.perf_counter() - start:.1f} |")
    getattr(proposer, "close", lambda: None)()


if __name__ == "__main__":
    main()
