"""Markdown tables for the benchmark's printout."""


def table(headers: list[str], rows: list[list]) -> str:
    """A markdown table; cells are printed with str()."""
    lines = ["| " + " | ".join(headers) + " |", "|" + "---|" * len(headers)]
    lines += ["| " + " | ".join(str(value) for value in row) + " |" for row in rows]
    return "\n".join(lines)


def cell(value: float | None, digits: int = 3) -> str:
    """A number rounded for a table cell; "—" when missing."""
    return "—" if value is None else f"{value:.{digits}f}"
