"""Tables for the command line: GitHub markdown, which reads well in a terminal too."""


def format_table(header: list[str], rows: list[list]) -> str:
    """A GitHub-markdown table (it reads well in a terminal too)."""
    cells = [header] + [[str(c) for c in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(header))]
    line = lambda row: "| " + " | ".join(c.ljust(w) for c, w in zip(row, widths)) + " |"  # noqa: E731
    return "\n".join([line(cells[0]), "|" + "|".join("-" * (w + 2) for w in widths) + "|"] + [line(r) for r in cells[1:]])
