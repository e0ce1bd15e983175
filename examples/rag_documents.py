"""RAG-style drafting: the model quotes documents that are not in its prompt.

A code assistant (or RAG pipeline) hands the drafter its document library once; each
request consults only the documents that share text with its prompt (an Aho-Corasick pass),
and drafts copy from them. Offline: standard-library files are the documents, and a
random-weight model is forced to write the next 200 tokens of one of them (see
lookahead/bench/workloads.py).

    python examples/rag_documents.py
"""

import sysconfig
import time
from pathlib import Path

import torch
import transformers
from transformers import LogitsProcessorList

from lookahead import DocumentLibrary, LookupDrafter
from lookahead.bench import workloads

bpe = workloads.tokenizer()
root = Path(sysconfig.get_paths()["stdlib"])
files = sorted(p for p in root.glob("*.py") if 4000 <= p.stat().st_size <= 30000)
library = DocumentLibrary()
for path in files:
    library.add(bpe.encode(path.read_text(errors="ignore")).ids)
print(f"library: {len(library)} documents, {library.num_tokens} tokens")

source = bpe.encode(files[len(files) // 2].read_text(errors="ignore")).ids
prompt = bpe.encode("Continue this code:\n").ids + source[300:360]
reference = source[360:560] + [bpe.token_to_id(workloads.EOS)]

torch.manual_seed(0)
config = transformers.Qwen2Config(
    vocab_size=workloads.VOCAB_SIZE, hidden_size=512, intermediate_size=2048, num_hidden_layers=8,
    num_attention_heads=8, num_key_value_heads=2, tie_word_embeddings=True,
)
model = transformers.AutoModelForCausalLM.from_config(config).eval()
input_ids = torch.tensor([prompt])
options = dict(
    max_new_tokens=len(reference), do_sample=False, eos_token_id=reference[-1], pad_token_id=reference[-1],
    logits_processor=LogitsProcessorList([workloads.FollowReference(len(prompt), reference)]),
)

outputs = []
for name, drafter in [("no documents", LookupDrafter(memory=False)), ("with the library", LookupDrafter(memory=False, documents=library))]:
    start = time.perf_counter()
    with torch.inference_mode():
        out = model.generate(input_ids, assistant_model=drafter, **options)
    seconds = time.perf_counter() - start
    outputs.append(out)
    new = out.shape[1] - input_ids.shape[1]
    print(f"{name:17s} {new / seconds:6.1f} tokens/s, {drafter.stats.tau:.2f} tokens per forward pass")
assert outputs[0].tolist() == outputs[1].tolist(), "outputs differ"
