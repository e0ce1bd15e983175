"""`lookahead show`: runs a model on a prompt with a LookupDrafter and shows where the drafts came from.

Prints the output with each kept draft marked by its source (DraftStats.render), the stats in
words, and with --html writes the page to open in a browser. torch and transformers are imported
when the command runs.
"""

import argparse
import sys
from pathlib import Path


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("model", help="hub name or local folder of a causal LM (e.g. ../shared/models/stories260K)")
    prompt = parser.add_mutually_exclusive_group(required=True)
    prompt.add_argument("--prompt", help="the prompt text")
    prompt.add_argument("--prompt-file", type=Path, help="a file holding the prompt text")
    parser.add_argument("--max-new-tokens", type=int, default=128, help="most tokens to generate (default 128)")
    parser.add_argument("--runs", type=int, default=1,
                        help="generate this many times with one drafter and show the last: later runs copy from memory (default 1)")
    parser.add_argument("--html", type=Path, default=None, help="also write the view as an HTML page here")
    parser.add_argument("--color", choices=["auto", "always", "never"], default="auto",
                        help="ANSI colours (auto: where stdout is a terminal), else [p|...] markers")


def run(args) -> int:
    import torch
    import transformers

    from lookahead import LookupDrafter, generate

    if args.max_new_tokens < 1 or args.runs < 1:
        raise ValueError("--max-new-tokens and --runs must be at least 1")
    text = args.prompt if args.prompt is not None else args.prompt_file.read_text(encoding="utf-8")
    tokenizer = transformers.AutoTokenizer.from_pretrained(args.model)
    model = transformers.AutoModelForCausalLM.from_pretrained(args.model).eval()
    inputs = tokenizer(text, return_tensors="pt")
    drafter = LookupDrafter()
    with torch.inference_mode():
        for _ in range(args.runs):
            generate(model, inputs["input_ids"], attention_mask=inputs["attention_mask"], drafter=drafter,
                     max_new_tokens=args.max_new_tokens, do_sample=False)
    color = None if args.color == "auto" else args.color == "always"
    drafter.stats.render(tokenizer, html=args.html, file=sys.stdout, color=color)
    if args.html is not None:
        print(f"wrote {args.html}")
    return 0
