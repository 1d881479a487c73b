"""The configuration reference is generated from the settings models: every setting has a description, and the
committed page (docs/configuration.md) is what the models render now."""

from __future__ import annotations

from gateway import config_reference
from gateway.config import Settings


def test_every_setting_has_a_description():
    assert config_reference.undescribed() == []


def test_the_committed_page_is_what_the_models_render():
    page = config_reference.PAGE.read_text()
    assert page == config_reference.render(), "stale: python -m gateway.config_reference --write docs/configuration.md"
    for name in Settings.model_fields:  # every variable is on the page, with its default and meaning
        assert f"| `GATEWAY_{name.upper()}` |" in page
    assert "| `prefill_piece_ms` | float | `5.0` |" in page
