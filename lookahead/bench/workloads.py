"""Offline benchmark workloads made from real text on this machine, and a model forced to write them.

No download: the text is Python's own standard library (code and docstrings) and the
license texts Debian ships; the tokenizer is a byte-level BPE trained on the fly.

- code-edit: a real stdlib module and an instruction to rename one of its functions;
  the reference output is the whole edited file (mostly copied: long drafts accepted).
- summarize: a long stdlib docstring or license text; the reference output quotes the
  first sentence of each paragraph (copying, broken by the summary's own words).
- chat: a question about one text answered with another text not in the prompt
  (nearly nothing to copy: the low-acceptance case).

A random model forced to the reference (the bench: traces.force_reference, in the forward;
the examples: `FollowReference`, a logits processor) costs what a real one of its shape does
(every forward pass, verification and drafting stays real) while acceptance follows the
reference exactly as it would for a model that writes it.
"""

import ast
import re
import sysconfig
from dataclasses import dataclass
from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import LogitsProcessor

VOCAB_SIZE = 8192
EOS = "<|eos|>"
_CACHE = Path.home() / ".cache" / "lookahead"
_LICENSES = Path("/usr/share/common-licenses")


@dataclass(frozen=True)
class ForcedRequest:
    prompt: list[int]
    reference: list[int]  # the output the model is forced to write, EOS included


def stdlib_sources(min_chars: int = 1500, max_chars: int = 4000) -> list[Path]:
    """Real Python files of a size a code assistant edits, in a fixed order."""
    root = Path(sysconfig.get_paths()["stdlib"])
    files = sorted(p for p in root.glob("*.py") if min_chars <= p.stat().st_size <= max_chars)
    return [p for p in files if re.search(r"^def (\w+)\(", p.read_text(errors="ignore"), re.M)]


def tokenizer():
    """A byte-level BPE with VOCAB_SIZE tokens trained on stdlib code and license prose; cached on disk."""
    path = _CACHE / f"bpe-{VOCAB_SIZE}.json"
    if path.is_file():
        return Tokenizer.from_file(str(path))
    root = Path(sysconfig.get_paths()["stdlib"])
    texts = [p.read_text(errors="ignore") for p in sorted(root.glob("*.py"))]
    texts += [p.read_text(errors="ignore") for p in sorted(_LICENSES.glob("*")) if p.is_file()]
    bpe = Tokenizer(models.BPE())
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=VOCAB_SIZE, special_tokens=[EOS], show_progress=False)
    bpe.train_from_iterator(texts, trainer)
    _CACHE.mkdir(parents=True, exist_ok=True)
    bpe.save(str(path))
    return bpe


def _prose() -> list[str]:
    """Long prose passages: license texts if the system ships them, else stdlib docstrings."""
    passages = [p.read_text(errors="ignore") for p in sorted(_LICENSES.glob("*")) if p.is_file()]
    passages = [t for t in passages if len(t) > 3000]
    if len(passages) < 4:
        root = Path(sysconfig.get_paths()["stdlib"])
        for p in sorted(root.glob("*.py")):
            doc = ast.get_docstring(ast.parse(p.read_text(errors="ignore"))) or ""
            if len(doc) > 1500:
                passages.append(doc)
    return passages


def _first_sentences(text: str, max_chars: int) -> str:
    paragraphs = [" ".join(p.split()) for p in re.split(r"\n\s*\n", text) if len(p.split()) > 8]
    out = []
    for p in paragraphs:
        sentence = re.split(r"(?<=[.;:])\s", p, maxsplit=1)[0]
        out.append(f"- {sentence}")
        if sum(map(len, out)) > max_chars:
            break
    return "Key points:\n" + "\n".join(out)


def make_workloads(*, requests: int) -> dict[str, list[tuple[str, str]]]:
    """`requests` (prompt, reference output) text pairs per workload."""
    workloads = {"code-edit": [], "summarize": [], "chat": []}
    sources = stdlib_sources()
    for path in sources[:: max(1, len(sources) // 16)][:requests]:
        source = path.read_text(errors="ignore")
        name = re.search(r"^def (\w+)\(", source, re.M).group(1)
        edited = re.sub(rf"\b{name}\b", f"{name}_v2", source)
        prompt = f"Rename the function `{name}` to `{name}_v2` in {path.name}; return the whole file.\n\n```python\n{source}```\n"
        workloads["code-edit"].append((prompt, f"```python\n{edited}```"))
    prose = _prose()
    for i in range(requests):
        text = prose[i % len(prose)][:6000]
        workloads["summarize"].append((f"Summarize the following text.\n\n{text}\n", _first_sentences(text, 1500)))
        other = prose[(i + len(prose) // 2) % len(prose)]
        workloads["chat"].append((f"What do you think of this?\n\n{text[:1500]}\n", other[2000:5000]))
    return workloads


def encode(bpe, pairs: list[tuple[str, str]], max_output_tokens: int) -> list[ForcedRequest]:
    """Token ids of (prompt, reference) pairs; each reference cut to max_output_tokens and ended by EOS."""
    eos = bpe.token_to_id(EOS)
    return [ForcedRequest(bpe.encode(p).ids, bpe.encode(o).ids[:max_output_tokens] + [eos]) for p, o in pairs]


def token_stream(bpe, length: int) -> list[int]:
    """`length` tokens of real code (the stdlib, file after file): the overhead benchmark's context."""
    root = Path(sysconfig.get_paths()["stdlib"])
    ids = []
    for path in sorted(root.rglob("*.py")):
        ids += bpe.encode(path.read_text(errors="ignore")).ids
        if len(ids) >= length:
            return ids[:length]
    raise ValueError(f"the standard library holds fewer than {length} tokens")


class FollowReference(LogitsProcessor):
    """Makes the reference's next token the argmax; the model's forward pass is untouched.

    At sequence length prompt_len + t it lifts reference[t] above every other logit. Applied
    per position by transformers' assisted loop as by plain generate, so both agree exactly.
    """

    def __init__(self, prompt_len: int, reference: list[int]):
        self.prompt_len = prompt_len
        self.reference = torch.tensor(reference)

    def __call__(self, input_ids: torch.LongTensor, scores: torch.FloatTensor) -> torch.FloatTensor:
        t = input_ids.shape[1] - self.prompt_len
        if 0 <= t < self.reference.shape[0]:
            scores[:, self.reference[t]] = scores.max() + 1.0
        return scores
