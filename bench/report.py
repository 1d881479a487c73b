"""The benchmark scripts' shared output: one marked section of docs/benchmarks.md per script."""

from __future__ import annotations

from pathlib import Path


def markers(name: str) -> tuple[str, str]:
    return f"<!-- {name}:start -->", f"<!-- {name}:end -->"


def write_section(path: Path, name: str, section: str, title: str = "Benchmarks") -> None:
    """Replace the script's section (its markers included in `section`), or append it."""
    start, end = markers(name)
    text = path.read_text() if path.exists() else f"# {title}\n\nFigures written by the scripts in `bench/`.\n"
    if start in text:
        head, rest = text.split(start, 1)
        text = head + section + rest.split(end, 1)[1]
    else:
        text = text.rstrip("\n") + "\n\n" + section + "\n"
    path.write_text(text)
