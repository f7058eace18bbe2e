"""How to run `taotrace` again from the user's shell, for the hints the tools print.

`make demo` runs `.venv/bin/taotrace`, which is not on PATH: a hint saying `taotrace probe ...`
would be "command not found". So a hint names the command the way it works here: `taotrace`
when that name on PATH is this very installation (the script beside the running Python, or one
whose `#!` line names that Python), else the path of the script beside the running Python
(relative when it is under the current folder), else `python -m proxy` with that Python.

    taotrace_command(sys.executable, os.environ.get("PATH"), Path.cwd())  ->  ".venv/bin/taotrace"
"""

from __future__ import annotations

import os
import shlex
import shutil
from pathlib import Path

__all__ = ["taotrace_command"]


def _shown(path: Path, cwd: Path) -> str:
    """`path` as short as it stays runnable: relative (with a slash, so the shell runs the file
    rather than looking it up on PATH) when it is under `cwd`."""
    try:
        relative = path.relative_to(cwd)
    except ValueError:
        return shlex.quote(str(path))
    text = str(relative)
    return shlex.quote(text if os.sep in text else f".{os.sep}{text}")


def _same(a: str | Path, b: Path) -> bool:
    try:
        return os.path.samefile(a, b)
    except OSError:
        return False


def _runs_with(script: str, python: Path) -> bool:
    """Whether the console script `script` starts with `#!<python>` (pip writes that line)."""
    try:
        with open(script, "rb") as f:
            first = f.readline(4096)
    except OSError:
        return False
    # Compared as paths, not as files: two venvs' pythons are often links to one interpreter.
    return first.startswith(b"#!") and os.path.abspath(os.fsdecode(first[2:].strip())) == os.path.abspath(python)


def taotrace_command(executable: str, search_path: str | None, cwd: Path) -> str:
    """The words that run this installation's `taotrace` from `cwd`, with `search_path` as PATH.
    `executable`: the running Python (`sys.executable`, not resolved: in a venv its folder is the
    venv's `bin`, where the console script is)."""
    python = Path(executable)
    script = python.parent / "taotrace"
    on_path = shutil.which("taotrace", path=search_path)
    if on_path is not None and (_same(on_path, script) or _runs_with(on_path, python)):
        return "taotrace"
    if script.is_file():
        return _shown(script, cwd)
    return f"{_shown(python, cwd)} -m proxy"  # run from a source tree, not installed
