"""Tables for the command line: GitHub markdown, which reads well in a terminal too."""

import json
from pathlib import Path


def format_table(header: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table (it reads well in a terminal too)."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]])


def json_report(args, payload: dict) -> bool:
    """Writes `payload` as JSON to --json-out if given and prints it with --json; True with --json (then print nothing else)."""
    if getattr(args, "json_out", None) is not None:
        Path(args.json_out).write_text(json.dumps(payload) + "\n")
    if args.json:
        print(json.dumps(payload))
    return args.json
