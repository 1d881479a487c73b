"""The documentation site builds with `mkdocs build --strict`: no broken link or anchor, no page left out of the
navigation; and strict it is (a page with a broken link, or one outside the navigation, fails the build)."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _build(project: Path, output: Path) -> subprocess.CompletedProcess[str]:
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1"}
    command = [sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(project / "mkdocs.yml")]
    return subprocess.run([*command, "-d", str(output)], capture_output=True, text=True, timeout=300, env=env)


def test_the_site_builds_strictly(tmp_path):
    built = _build(ROOT, tmp_path / "site")
    assert built.returncode == 0, built.stderr[-3000:]
    pages = {page.stem for page in (ROOT / "docs").glob("*.md")} - {"index"}
    assert {page for page in pages if (tmp_path / "site" / page / "index.html").exists()} == pages


def test_a_broken_link_or_a_page_outside_the_navigation_fails_the_build(tmp_path):
    def append(docs: Path, text: str) -> None:
        (docs / "install.md").write_text((docs / "install.md").read_text() + text)

    for case, change in {
        "link": lambda docs: append(docs, "\n[x](nowhere.md)\n"),
        "anchor": lambda docs: append(docs, "\n[x](status.md#no-such-heading)\n"),
        "page": lambda docs: (docs / "orphan.md").write_text("# Orphan\n"),
    }.items():
        project = tmp_path / case
        shutil.copytree(ROOT / "docs", project / "docs", ignore=shutil.ignore_patterns("*.json", "*.log"))
        shutil.copy(ROOT / "mkdocs.yml", project / "mkdocs.yml")
        change(project / "docs")
        built = _build(project, project / "site")
        assert built.returncode != 0, f"{case}: the build passed"
