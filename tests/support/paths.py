"""Where the tests find the repository's other parts."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
CHART = ROOT / "helm" / "gpt-oss-gateway"
SUPPORT = Path(__file__).resolve().parent
