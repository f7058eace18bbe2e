"""The README leads a newcomer from what taotrace is to a running proxy, and every code block in
it runs as written: the shell and Python blocks are run against `taotrace sim` + `taotrace serve`
started from the README's own blocks on free ports. The user documents (README.md, docs/*.md)
stay short, linked and free of our working history."""

from __future__ import annotations

import json
import os
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.request
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import pytest
import tomllib

ROOT = Path(__file__).resolve().parent.parent
README = (ROOT / "README.md").read_text()
USER_DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]

# The only README blocks not run, and why: what they need a test cannot have.
SKIPPED = {
    "make test runs this suite; make demo serves until Ctrl-C": "make demo",
    "needs Docker": "docker compose",
}
# Output, pictures and config shown; not code.
LANGUAGES = {"python", "sh", "text", "json", "toml"}
# The ports the README documents, and the variables the commands read them from.
PORTS = {
    "proxy": (8787, "TAOTRACE_PORT"),
    "metrics": (9464, "TAOTRACE_METRICS_PORT"),
    "sim": (8788, "TAOTRACE_SIM_PORT"),
}


@dataclass(frozen=True)
class Block:
    """One fenced code block: its language, its text, the `docs-test` mark above it, its line."""

    lang: str
    body: str
    mark: str
    line: int


def _blocks(text: str) -> list[Block]:
    out: list[Block] = []
    lines = text.splitlines()
    i = 0
    while i < len(lines):
        if lines[i].startswith("```"):
            lang, start = lines[i][3:].strip(), i
            mark = re.fullmatch(r"<!-- docs-test: (.*) -->", lines[i - 1]) if i else None
            i += 1
            while not lines[i].startswith("```"):
                i += 1
            out.append(Block(lang, "\n".join(lines[start + 1 : i]) + "\n", mark.group(1) if mark else "", start + 1))
        i += 1
    return out


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
    order = [
        "The two commands",
        "Try it locally",
        "Point your tools at it",
        "What you see",
        "Configuration",
        "Where to go next",
    ]
    top = _sections("##")
    assert [s for s in top if s in order] == order, top
    assert top[-1] == "Where to go next"


def test_the_readme_stays_short() -> None:
    # Reference material lives in docs/, one subject a page; the README gets a newcomer going.
    assert len(README.splitlines()) <= 400


def test_the_first_screen_gets_to_the_demo() -> None:
    first_screen = "\n".join(README.splitlines()[:40])
    assert "make demo" in first_screen and "make test" in first_screen


def test_install_without_make_and_the_article_are_named() -> None:
    assert "pip install ." in README and "pipx install ." in README
    assert re.search(r"life of an LLM request \(tokenize,\s+prefill, decode, release\)", README)
    assert "source .venv/bin/activate" in README  # how `taotrace` gets on PATH after make demo


def test_every_doc_page_is_linked_from_the_readme() -> None:
    for doc in sorted((ROOT / "docs").glob("*.md")):
        assert f"](docs/{doc.name}" in README, doc.name


def _slug(heading: str) -> str:
    """GitHub's anchor for a heading: lower case, punctuation dropped, spaces to hyphens."""
    return re.sub(r"[^\w\- ]", "", heading.strip().lower()).replace(" ", "-")


def _anchors(path: Path) -> set[str]:
    seen: dict[str, int] = {}
    out: set[str] = set()
    fenced = False
    for line in path.read_text().splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (m := re.match(r"#{1,6} (.*)", line)):
            slug = _slug(m.group(1))
            n = seen.get(slug, 0)
            seen[slug] = n + 1
            out.add(slug if n == 0 else f"{slug}-{n}")
    return out


def test_links_between_the_documents_resolve() -> None:
    # Every relative link names a file that exists and, with a #fragment, a heading in it.
    broken = []
    for doc in USER_DOCS:
        text = re.sub(r"^```.*?^```", "", doc.read_text(), flags=re.M | re.S)
        for target in re.findall(r"\]\(([^)\s]+)\)", text):
            if re.match(r"[a-z]+:", target):
                continue
            file, _, fragment = target.partition("#")
            path = (doc.parent / file).resolve() if file else doc
            if not path.exists() or (fragment and path.suffix == ".md" and fragment not in _anchors(path)):
                broken.append(f"{doc.relative_to(ROOT)}: {target}")
    assert not broken, broken


# Our working history belongs in CHANGELOG.md and commit messages, not in what users read.
HISTORY = re.compile(
    r"\bround\s*\d+\b|\bthis round\b|\bround's\b|\bissues?\s*#?\d+|(?<![\w&/])#\d+\b|\bthis session\b", re.I
)


def test_user_documents_speak_to_users() -> None:
    found = [
        f"{doc.relative_to(ROOT)}:{n}: {m.group()}"
        for doc in USER_DOCS
        for n, line in enumerate(doc.read_text().splitlines(), 1)
        for m in HISTORY.finditer(line)
    ]
    assert not found, found


def test_the_history_check_catches_history() -> None:
    for words in ("Round 2: what it cost", "fixed in issue 12", "see #12", "this round's features", "in this session"):
        assert HISTORY.search(words), words
    for words in ("one round trip", "3 rounds", "round(increase(x[15m]))", "x-session-id", "`#{trace_id}`"):
        assert not HISTORY.search(words), words


def test_license_matches_the_image_label() -> None:
    assert "Apache License" in (ROOT / "LICENSE").read_text() and "Version 2.0" in (ROOT / "LICENSE").read_text()
    assert 'org.opencontainers.image.licenses="Apache-2.0"' in (ROOT / "deploy" / "Dockerfile").read_text()


def test_another_upstream_is_given_without_the_clients_path() -> None:
    # With the documented client base URL (…:8787/v1), an upstream ending in /v1 forwards to /v1/v1/….
    assert 'ARGS="--upstream http://127.0.0.1:8000"' in README
    assert not re.search(r'ARGS="--upstream [^"]*/v1"', README)


def test_every_block_is_code_we_know_or_output() -> None:
    for block in _blocks(README):
        assert block.lang in LANGUAGES, f"README.md:{block.line}: fence language {block.lang!r}"
        assert block.mark in ("", "background") or block.mark.startswith("skip "), block


def test_the_skipped_blocks_are_exactly_the_listed_ones() -> None:
    skipped = {b.mark.removeprefix("skip ").strip('"'): b.body for b in _blocks(README) if b.mark.startswith("skip ")}
    assert skipped.keys() == SKIPPED.keys()
    for reason, command in SKIPPED.items():
        assert command in skipped[reason], reason


def test_config_blocks_parse() -> None:
    for block in _blocks(README):
        if block.lang == "json":
            json.loads(block.body)
        elif block.lang == "toml":
            tomllib.loads(block.body)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _get(url: str) -> bytes:
    with urllib.request.urlopen(url, timeout=5) as response:
        return bytes(response.read())


def _wait_until(ready: str, procs: list[subprocess.Popen[bytes]], logs: Path, deadline: float = 30.0) -> None:
    end = time.monotonic() + deadline
    while time.monotonic() < end:
        for p in procs:
            assert p.poll() is None, f"a background block exited with {p.returncode}:\n{logs.read_text()}"
        try:
            _get(ready)
            return
        except OSError:
            time.sleep(0.1)
    raise AssertionError(f"{ready} never answered:\n{logs.read_text()}")


@pytest.fixture
def readme_servers(tmp_path: Path) -> Iterator[dict[str, int]]:
    """The README's background blocks (`taotrace sim`, `taotrace serve`), run on free ports."""
    ports = {name: _free_port() for name in PORTS}
    env = _env(ports)
    procs: list[subprocess.Popen[bytes]] = []
    logs = tmp_path / "servers.log"
    with logs.open("wb") as log:
        yield from _run_servers(ports, env, procs, log, logs)


def _run_servers(
    ports: dict[str, int], env: dict[str, str], procs: list[subprocess.Popen[bytes]], log: IO[bytes], logs: Path
) -> Iterator[dict[str, int]]:
    try:
        for block in (b for b in _blocks(README) if b.mark == "background"):
            procs.append(
                subprocess.Popen(
                    ["bash", "-c", _rewrite(block.body, ports)],
                    cwd=ROOT,
                    env=env,
                    start_new_session=True,  # the block's processes are one group, ended together
                    stdout=log,
                    stderr=log,
                )
            )
        assert len(procs) == 2
        _wait_until(f"http://127.0.0.1:{ports['sim']}/healthz", procs, logs)
        _wait_until(f"http://127.0.0.1:{ports['metrics']}/readyz", procs, logs)
        yield ports
    finally:
        for p in procs:
            if p.poll() is None:
                os.killpg(p.pid, signal.SIGTERM)
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait()


def _env(ports: dict[str, int]) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("TAOTRACE_", "OTEL_"))}
    env.update({var: str(ports[name]) for name, (_, var) in PORTS.items()})
    env["TAOTOKEN_API_KEY"] = "sk-readme-test"
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    return env


def _rewrite(body: str, ports: dict[str, int]) -> str:
    """The documented ports, as the free ones this run uses."""
    for name, (documented, _) in PORTS.items():
        body = re.sub(rf"(?<=(127\.0\.0\.1|localhost):){documented}\b", str(ports[name]), body)
    return body


def _settled(metrics: int) -> list[dict[str, object]]:
    """The proxy's finished requests, once none is in flight."""
    for _ in range(100):
        if json.loads(_get(f"http://127.0.0.1:{metrics}/api/summary"))["in_flight"] == 0:
            break
        time.sleep(0.05)
    rows: list[dict[str, object]] = json.loads(_get(f"http://127.0.0.1:{metrics}/api/requests?limit=1000"))["requests"]
    return rows


def test_the_readme_blocks_run_as_written(readme_servers: dict[str, int]) -> None:
    ports = readme_servers
    env = _env(ports)
    ran = 0
    for block in _blocks(README):
        if block.mark or block.lang not in ("sh", "python"):
            continue
        command = ["bash", "-e", "-c"] if block.lang == "sh" else [sys.executable, "-c"]
        done = subprocess.run(
            [*command, _rewrite(block.body, ports)], cwd=ROOT, env=env, capture_output=True, text=True, timeout=60
        )
        where = f"README.md:{block.line} ({block.lang})"
        assert done.returncode == 0, f"{where} failed:\n{done.stdout}\n{done.stderr}"
        assert done.stdout.strip(), f"{where} printed nothing"
        errors = [r for r in _settled(ports["metrics"]) if r["error_type"]]
        assert not errors, f"{where} recorded errors: {[(r['api'], r['status'], r['error_type']) for r in errors]}"
        ran += 1
    rows = _settled(ports["metrics"])
    assert ran >= 5
    assert {r["api"] for r in rows} >= {"chat_completions", "messages"}
    assert all(r["status"] == 200 for r in rows), rows


def test_the_changelog_keeps_its_format() -> None:
    # Keep a Changelog 1.1.0: `## [Unreleased]`, `## [X.Y.Z] - YYYY-MM-DD`, each with a link
    # reference at the end, and only the format's six kinds of change as subsections.
    text = (ROOT / "CHANGELOG.md").read_text()
    versions = re.findall(r"(?m)^## (.*)$", text)
    assert versions and versions[0] == "[Unreleased]", versions
    for heading in versions[1:]:
        assert re.fullmatch(r"\[\d+\.\d+\.\d+\] - \d{4}-\d{2}-\d{2}", heading), heading
    for name in re.findall(r"\[([^\]]+)\]", " ".join(versions)):
        assert re.search(rf"(?m)^\[{re.escape(name)}\]: \S+$", text), f"no link reference for [{name}]"
    kinds = set(re.findall(r"(?m)^### (.*)$", text))
    assert kinds <= {"Added", "Changed", "Deprecated", "Removed", "Fixed", "Security"}, kinds
