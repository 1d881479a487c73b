"""The install size of each extra: `pip install` of this checkout into a fresh venv, per variant.

    python bench/install_size.py [--write docs/benchmarks.md]

Each variant (no extra: a replica in front of a model server; `engine`: the built-in engine, the default
backend; `cuda`: the engine with CUDA, cuDNN and nvcc as wheels) is installed into its own new venv from
the package index (pip's cache makes repeated runs quick). Recorded: the size of site-packages less that
of an empty venv's (pip itself), and the largest packages. Needs the package index.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

from bench.report import markers, write_section  # noqa: E402

SECTION = "install-size"
VARIANTS = (("", "a replica in front of a model server"), ("engine", "the built-in engine (the default backend)"))
MIB = 1024 * 1024


def _size(path: Path) -> int:
    total = 0
    for root, _, files in os.walk(path):
        for name in files:
            full = Path(root) / name
            if not full.is_symlink():
                total += full.stat().st_size
    return total


def _site(venv: Path) -> Path:
    return next(venv.glob("lib/python*/site-packages"))


def measure(extra: str, workdir: Path) -> tuple[int, list[tuple[str, int]]]:
    venv = workdir / (extra or "base")
    subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    empty = _size(_site(venv))
    target = f"{ROOT}[{extra}]" if extra else str(ROOT)
    subprocess.run([str(venv / "bin" / "pip"), "install", "-q", target], check=True, timeout=1800)
    site = _site(venv)
    packages = sorted(
        (
            (entry.name, _size(entry))
            for entry in site.iterdir()
            if entry.is_dir() and not entry.name.endswith("-info") and entry.name not in ("pip", "setuptools")
        ),
        key=lambda pair: -pair[1],
    )
    return _size(site) - empty, packages[:5]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--write", type=Path, help="update this markdown file's install-size section")
    parser.add_argument("--cuda", action="store_true", help="also measure the cuda extra (several GB)")
    args = parser.parse_args()
    variants = [*VARIANTS, ("cuda", "the engine with CUDA and nvcc wheels")] if args.cuda else list(VARIANTS)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for extra, what in variants:
            size, largest = measure(extra, Path(tmp))
            top = ", ".join(f"{name} {bytes_ / MIB:.0f}" for name, bytes_ in largest)
            rows.append(
                f"| `{'gpt-oss-gateway' + (f'[{extra}]' if extra else '')}` | {what} | {size / MIB:.0f} | {top} |"
            )
            print(rows[-1], flush=True)
    start, end = markers(SECTION)
    section = "\n".join(
        [
            start,
            "## Install size of each extra (`bench/install_size.py`)",
            "",
            f"`pip install` of this checkout into a fresh venv on {sys.platform} (Python "
            f"{sys.version_info.major}.{sys.version_info.minor}): site-packages less an empty venv's, in MiB.",
            "",
            "| install | for | MiB | largest packages (MiB) |",
            "|---|---|---|---|",
            *rows,
            end,
        ]
    )
    if args.write:
        write_section(args.write, SECTION, section)
    print(section)


if __name__ == "__main__":
    main()
