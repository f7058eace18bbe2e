"""The README leads a newcomer from what taotrace is to a running demo, then to the reference."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()


def _sections(level: str) -> list[str]:
    """Headings of one level, outside code blocks."""
    out, fenced = [], False
    for line in README.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and line.startswith(level + " "):
            out.append(line[len(level) + 1 :])
    return out


def test_sections_come_in_a_newcomers_order() -> None:
    order = ["The two commands", "Point your tools at it", "What you see", "Configuration", "Reference"]
    top = _sections("##")
    assert [s for s in top if s in order] == order, top
    assert top[-1] == "Reference"  # everything after it is reference material


def test_the_first_screen_gets_to_the_demo() -> None:
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen


def test_install_without_make_and_the_article_are_named() -> None:
    assert "pip install ." in README and "pipx install ." in README
    assert re.search(r"life of an LLM request \(tokenize,\s+prefill, decode, release\)", README)


def test_the_long_records_live_in_docs_and_are_linked() -> None:
    for doc in ("docs/performance.md", "docs/reliability.md"):
        assert (ROOT / doc).is_file() and f"]({doc}" in README


def test_license_matches_the_image_label() -> None:
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "deploy" / "Dockerfile").read_text()


def test_another_upstream_is_given_without_the_clients_path() -> None:
    # With the documented client base URL (…:8787/v1), an upstream ending in /v1 forwards to /v1/v1/….
    assert 'ARGS="--upstream http://127.0.0.1:8000"' in README
    assert not re.search(r'ARGS="--upstream [^"]*/v1"', README)
