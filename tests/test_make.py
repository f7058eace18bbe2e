"""The Makefile's venv logic, run by the real `make` on a copy of the Makefile with fake Pythons
(shell scripts that answer as a given version would): a too-old or missing Python is one line,
a stamp is written only after its install succeeded, and a venv made by an old Python, or whose
Python is gone, is made afresh."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# A Python as far as the Makefile can tell: `-c` (the Makefile's one question: version, pip,
# path), `-m venv DIR` (a venv whose python is this same script, with a `taotrace` that echoes
# its arguments), `-m pip install` (logged in the venv; fails while `pip-fails` exists).
FAKE_PYTHON = """#!/bin/sh
here="$(cd "$(dirname "$0")" && pwd)"
case "$1" in
  -c) echo "{version} pip $here/$(basename "$0")" ;;
  -m)
    case "$2" in
      venv)
        mkdir -p "$3/bin" && cp "$0" "$3/bin/python" && : > "$3/pyvenv.cfg"
        printf '#!/bin/sh\\necho "taotrace $*"\\n' > "$3/bin/taotrace" && chmod +x "$3/bin/taotrace" ;;
      pip)
        echo "$*" >> "$here/../pip.log"
        [ ! -e "$here/../../pip-fails" ] ;;
      *) exit 2 ;;
    esac ;;
  *) exit 2 ;;
esac
"""

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="make is not installed")


def _fake_python(path: Path, version: str) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(FAKE_PYTHON.replace("{version}", version))
    path.chmod(0o755)
    return path


@pytest.fixture
def project(tmp_path: Path) -> Path:
    """A copy of the Makefile beside a pyproject.toml (the stamps' prerequisite)."""
    shutil.copy(ROOT / "Makefile", tmp_path / "Makefile")
    (tmp_path / "pyproject.toml").write_text("[project]\nname = 'x'\n")
    return tmp_path


# Under `make test` the suite inherits the outer make's MAKELEVEL/MAKEFLAGS: a child make would
# then call itself `make[2]` and take the outer command line's variables. Run it as a user would.
_OUTER_MAKE = frozenset({"MAKELEVEL", "MAKEFLAGS", "MFLAGS", "MAKEOVERRIDES", "MAKE_TERMOUT", "MAKE_TERMERR"})


def _make(project: Path, *args: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if k not in _OUTER_MAKE}
    return subprocess.run(
        ["make", "--no-print-directory", *args], cwd=project, capture_output=True, text=True, timeout=60, env=env
    )


def _ours(stderr: str) -> list[str]:
    """stderr less make's own `make: *** [...] Error 1` line."""
    return [line for line in stderr.splitlines() if not line.startswith("make: ***")]


def _pip_runs(project: Path) -> int:
    log = project / ".venv" / "pip.log"
    return len(log.read_text().splitlines()) if log.exists() else 0


def test_a_too_old_or_missing_python_is_one_line_and_makes_no_venv(project: Path) -> None:
    old = _fake_python(project / "old" / "python3.9", "3.9.18")
    result = _make(project, "demo", f"PYTHON={old}")
    assert result.returncode != 0 and result.stdout == ""
    assert _ours(result.stderr) == [
        f"make: PYTHON={old} is Python 3.9.18 ({old}); taotrace needs Python >= 3.10: "
        "install one, then make demo PYTHON=python3.12 (for example)"
    ]
    assert not (project / ".venv").exists()

    result = _make(project, "probe", "PYTHON=no-such-python3")
    assert _ours(result.stderr) == [
        "make: no Python found as PYTHON=no-such-python3; taotrace needs Python >= 3.10: "
        "install one, then make probe PYTHON=python3.12 (for example)"
    ]
    assert result.returncode != 0 and not (project / ".venv").exists()


def test_a_stamp_is_written_only_after_its_install_succeeded(project: Path) -> None:
    good = _fake_python(project / "good" / "python3", "3.12.1")
    stamp = project / ".venv" / ".installed-runtime"
    (project / "pip-fails").touch()
    result = _make(project, "demo", f"PYTHON={good}", "ARGS=--once")
    assert result.returncode != 0 and not stamp.exists() and _pip_runs(project) == 1
    assert _ours(result.stderr) == [
        f"creating .venv with Python 3.12.1 ({good})",
        "installing dependencies into .venv (first run only)...",
        "make: installing into .venv failed (pip's message above); run make again to retry",
    ]

    (project / "pip-fails").unlink()
    result = _make(project, "demo", f"PYTHON={good}", "ARGS=--once")
    assert result.returncode == 0, result.stderr
    assert stamp.exists() and _pip_runs(project) == 2  # tried again, in the same (sound) venv
    assert _ours(result.stderr) == ["installing dependencies into .venv (first run only)..."]
    assert result.stdout == "taotrace demo --once\n"  # only the command's own output on stdout

    result = _make(project, "probe", f"PYTHON={good}", "ARGS=--runs 3")
    assert result.returncode == 0 and result.stderr == "" and _pip_runs(project) == 2  # installed: not again
    assert result.stdout == "taotrace probe --runs 3\n"


@pytest.mark.parametrize("venv_python", ["old", "gone"])
def test_a_venv_from_an_old_or_vanished_python_is_made_afresh(project: Path, venv_python: str) -> None:
    venv = project / ".venv"
    if venv_python == "old":  # made by `python3 -m venv` on a 3.9 system, its stamp left from then
        _fake_python(venv / "bin" / "python", "3.9.18")
    else:  # the Python it linked to was upgraded away
        (venv / "bin").mkdir(parents=True)
        (venv / "bin" / "python").symlink_to(project / "no-such-python3.8")
    (venv / "pyvenv.cfg").touch()
    (venv / ".installed-runtime").touch()
    good = _fake_python(project / "good" / "python3", "3.12.1")
    result = _make(project, "doctor", f"PYTHON={good}")
    assert result.returncode == 0, result.stderr
    assert _ours(result.stderr) == [
        f"creating .venv with Python 3.12.1 ({good})",
        "recreating .venv: its Python is missing, broken, older than 3.10 or without pip",
        "installing dependencies into .venv (first run only)...",
    ]
    assert result.stdout == "taotrace doctor\n" and _pip_runs(project) == 1
    assert (venv / "bin" / "python").read_text() == good.read_text()


def test_a_folder_that_is_no_venv_is_never_deleted(project: Path) -> None:
    mine = project / "mine"
    (mine / "bin").mkdir(parents=True)
    (mine / "notes.txt").write_text("keep me")
    good = _fake_python(project / "good" / "python3", "3.12.1")
    result = _make(project, "demo", f"PYTHON={good}", "VENV=mine")
    assert result.returncode != 0 and (mine / "notes.txt").read_text() == "keep me"
    assert _ours(result.stderr)[-1] == "make: mine exists and is not a virtualenv: move it away, or set VENV="
