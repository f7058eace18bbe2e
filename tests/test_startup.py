"""What `taotrace serve` (and `sim`, `demo`) say and do at start, on real processes.

A port that is taken is one line naming the address and the flag to change, exit status 2, in
about a second, in one process and with `--workers 2` (it used to take 41 s with workers, print
nothing meanwhile and ignore Ctrl-C). The startup line says where
metrics, the live view and the spans go; an open live view and a misspelled `TAOTRACE_*` name
are warned about, never with a value.
"""

from __future__ import annotations

import errno
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from argparse import ArgumentParser
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path

import pytest

from proxy.cli import COMMANDS, Flags, settings_class, unknown_variable_warnings
from proxy.server.banner import exposed, live_view_warning
from proxy.server.listen import CannotListen, bind, refusal
from proxy.telemetry.otlp_env import shown_endpoint, span_destination

ROOT = Path(__file__).resolve().parents[1]
REFUSED_WITHIN = 10.0  # seconds; about 1 s measured on this machine, 41 s before with --workers
LOG_PREFIX = re.compile(r"^\S+ \S+ ERROR taotrace: ")  # serve's log format: date, time, level, logger
STARTED = re.compile(r"taotrace proxy on http://\S+ .*\n")
SERVE_ERROR = re.compile(r"^\S+ \S+ (?:ERROR|WARNING) ", re.M)


def _env(**extra: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("OTEL_", "TAOTRACE_"))}
    return {**env, "PYTHONPATH": str(ROOT), **extra}


def _taotrace(*args: str, env: Mapping[str, str] | None = None) -> tuple[int, str, float]:
    """Run `python -m proxy ARGS` to its end: (exit status, stderr, seconds taken)."""
    t0 = time.monotonic()
    done = subprocess.run(
        [sys.executable, "-m", "proxy", *args],
        cwd=ROOT,
        env=_env() if env is None else env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    return done.returncode, done.stderr, time.monotonic() - t0


@contextmanager
def _taken() -> Iterator[int]:
    """A port another process would hold: bound and listening (no SO_REUSEPORT)."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        sock.listen()
        yield sock.getsockname()[1]


class _Serving:
    """`taotrace serve ARGS` left running; stderr in a file, read while it runs."""

    def __init__(self, *args: str, env: Mapping[str, str]) -> None:
        self._dir = tempfile.TemporaryDirectory(prefix="taotrace-start-")
        self.path = Path(self._dir.name) / "stderr.log"
        self._err = open(self.path, "wb")
        self.proc = subprocess.Popen(
            [sys.executable, "-m", "proxy", "serve", *args], cwd=ROOT, env=dict(env), stdout=subprocess.DEVNULL,
            stderr=self._err,
        )  # fmt: skip

    def text(self) -> str:
        return self.path.read_bytes().decode("utf-8", "replace")

    def started(self, timeout: float = 60.0) -> str:
        """The startup line, once it is out."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            found = STARTED.search(self.text())
            if found:
                return found.group(0).strip()
            assert self.proc.poll() is None, self.text()
            time.sleep(0.05)
        raise AssertionError(f"no startup line in:\n{self.text()}")

    def stop(self) -> int:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
        try:
            return self.proc.wait(timeout=30)
        finally:
            if self.proc.poll() is None:
                self.proc.kill()
                self.proc.wait()
            self._err.close()
            self._dir.cleanup()


def _refused(port: int, flag: str) -> str:
    return f"cannot listen on 127.0.0.1:{port}: address already in use (another taotrace running? choose another port with {flag})"


MODES = {"one process": (), "--workers 2": ("--workers", "2")}


@pytest.mark.parametrize("taken_flag", ["--port", "--metrics-port"])
@pytest.mark.parametrize("mode", list(MODES))
def test_a_taken_port_is_one_line_naming_address_and_flag_exit_2_at_once(mode: str, taken_flag: str) -> None:
    with _taken() as port:
        other = "--metrics-port" if taken_flag == "--port" else "--port"
        status, stderr, took = _taotrace("serve", taken_flag, str(port), other, "0", *MODES[mode])
    lines = stderr.splitlines()
    assert status == 2, stderr
    assert len(lines) == 1, stderr  # no drain report, no worker's complaint, no traceback
    assert LOG_PREFIX.match(lines[0]), lines[0]
    assert LOG_PREFIX.sub("", lines[0]) == _refused(port, taken_flag)
    assert took < REFUSED_WITHIN, took


@pytest.mark.parametrize(
    "args,prefix,flag",
    [
        (("sim",), "taotrace sim: ", "--port"),
        (("demo", "--once"), "demo: ", "--port"),
        (("demo", "--once"), "demo: ", "--metrics-port"),
        (("demo", "--once"), "demo: ", "--sim-port"),
    ],
    ids=["sim --port", "demo --port", "demo --metrics-port", "demo --sim-port"],
)
def test_sim_and_demo_say_the_same_line_naming_their_own_flag(args: tuple[str, ...], prefix: str, flag: str) -> None:
    with _taken() as port:
        status, stderr, took = _taotrace(*args, flag, str(port))
    assert status == 2, stderr
    assert stderr.splitlines() == [prefix + _refused(port, flag)]
    assert took < REFUSED_WITHIN, took


@pytest.mark.timeout(120)
def test_a_second_group_on_the_port_of_a_running_group_is_refused() -> None:
    """Workers share their port with SO_REUSEPORT, which would let a second group of the same
    user join it and silently take half the connections."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    first = _Serving("--port", str(port), "--metrics-port", "0", "--workers", "2", env=_env())
    try:
        line = first.started()
        assert f"taotrace proxy on http://127.0.0.1:{port} (2 workers, pids " in line
        assert "spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)" in line
        assert re.search(r"; live view on http://127\.0\.0\.1:\d+/ \(no token\);", line), line
        for mode in ("--workers 2", "one process"):
            status, stderr, took = _taotrace("serve", "--port", str(port), "--metrics-port", "0", *MODES[mode])
            assert status == 2, (mode, stderr)
            assert LOG_PREFIX.sub("", stderr.strip()) == _refused(port, "--port"), mode
            assert took < REFUSED_WITHIN, took
    finally:
        assert first.stop() == 0


@pytest.mark.timeout(60)
def test_the_startup_line_says_where_spans_go_without_credentials_and_warns_of_an_open_live_view() -> None:
    endpoint = "http://taotrace-user:s3cret-pw@127.0.0.1:9/base"
    env = _env(OTEL_EXPORTER_OTLP_ENDPOINT=endpoint, OTEL_EXPORTER_OTLP_PROTOCOL="http/protobuf")
    serving = _Serving("--port", "0", "--metrics-port", "0", "--metrics-host", "0.0.0.0", "--capture-content", env=env)
    try:
        line = serving.started()
        text = serving.text()
    finally:
        serving.stop()
    metrics = re.search(r"metrics on (http://0\.0\.0\.0:\d+)/metrics;", line)
    assert metrics, line
    assert line.endswith(
        f"; live view on {metrics.group(1)}/ (no token); spans to http://127.0.0.1:9/base/v1/traces (OTLP http/protobuf)"
    )
    warning = (
        f"WARNING taotrace: the live view on {metrics.group(1)}/ is open to anyone who can reach this address and "
        "shows every request's prompt and completion (--capture-content); set TAOTRACE_UI_TOKEN, listen on "
        "127.0.0.1 (--metrics-host), or turn it off (--no-ui)"
    )
    assert warning in text
    assert "s3cret" not in text and "taotrace-user" not in text


@pytest.mark.timeout(60)
def test_the_startup_line_names_the_upstream_of_a_root_route() -> None:
    # `--route NAME:/=URL` takes every path no other route claims: that is the upstream to name,
    # not --upstream's default (which then receives nothing).
    serving = _Serving(
        "--port", "0", "--metrics-port", "0", "--route", "local:/=http://u:pw@127.0.0.1:9/api",
        "--route", "other:/other=http://127.0.0.1:10", env=_env(),
    )  # fmt: skip
    try:
        line = serving.started()
        text = serving.text()
    finally:
        serving.stop()
    assert " -> http://127.0.0.1:9/api;" in line, line
    assert "taotoken" not in line and "pw@" not in text


@pytest.mark.timeout(60)
def test_a_token_protected_live_view_is_said_so_and_not_warned_about() -> None:
    env = _env(TAOTRACE_UI_TOKEN="a-token-for-the-live-view", OTEL_EXPORTER_OTLP_ENDPOINT="grpc-collector:4317",
               OTEL_EXPORTER_OTLP_PROTOCOL="grpc")  # fmt: skip
    serving = _Serving("--port", "0", "--metrics-port", "0", "--metrics-host", "0.0.0.0", "--workers", "2", env=env)
    try:
        line = serving.started()
        text = serving.text()
    finally:
        serving.stop()
    assert "(2 workers, pids " in line
    assert re.search(
        r"; live view on http://0\.0\.0\.0:\d+/ \(token required\); spans to grpc-collector:4317 \(OTLP grpc\)$", line
    ), line
    assert "WARNING" not in text and "a-token-for-the-live-view" not in text


@pytest.mark.timeout(60)
def test_serve_warns_of_a_misspelled_variable_with_the_name_meant_never_the_value() -> None:
    env = _env(
        TAOTRACE_UPSTREM="http://vllm.internal:8000/v1", TAOTRACE_MAX_BODY="sk-not-shown-1234", TAOTRACE_SIM_PORT="9999"
    )  # fmt: skip  (the simulator's: known, not warned about)
    serving = _Serving("--port", "0", "--metrics-port", "0", env=env)
    try:
        line = serving.started()
        text = serving.text()
    finally:
        serving.stop()
    warnings = [x for x in text.splitlines() if "warning:" in x]
    assert warnings == [
        "taotrace serve: warning: TAOTRACE_MAX_BODY is not a taotrace setting and is ignored; "
        "did you mean TAOTRACE_MAX_BODY_BYTES?",
        "taotrace serve: warning: TAOTRACE_UPSTREM is not a taotrace setting and is ignored; "
        "did you mean TAOTRACE_UPSTREAM?",
    ]
    assert "-> https://taotoken.net/api;" in line  # what the warning is about: the default upstream
    assert "vllm.internal" not in text and "sk-not-shown" not in text


@pytest.mark.parametrize(
    "command,variable,value,said",
    [
        ("serve", "OTEL_EXPORTER_OTLP_PROTOCOL", "http/json", "OTEL_EXPORTER_OTLP_PROTOCOL=http/json is not supported (nor by OpenTelemetry's Python exporters): use grpc or http/protobuf"),
        ("serve", "OTEL_TRACES_EXPORTER", "otlp,zipkin", "OTEL_TRACES_EXPORTER names 'zipkin', which no installed package provides (an entry point in opentelemetry_traces_exporter): install its exporter, or leave it out"),
        # The OpenTelemetry API loads these when it is imported: a traceback, were they not judged first.
        ("serve", "OTEL_PROPAGATORS", "tracecontext,b3nowhere", "OTEL_PROPAGATORS names 'b3nowhere', which no installed package provides (an entry point in opentelemetry_propagator): install it (e.g. opentelemetry-propagator-b3), or leave it out"),
        ("serve", "OTEL_BSP_SCHEDULE_DELAY", "5s", "OTEL_BSP_SCHEDULE_DELAY='5s' is not a positive integer"),
        ("demo", "OTEL_EXPORTER_OTLP_COMPRESSION", "br", "OTEL_EXPORTER_OTLP_COMPRESSION='br' is not one of gzip, deflate, none"),
    ],
)  # fmt: skip
def test_an_otel_variable_taotrace_cannot_honour_stops_it_in_one_line(
    command: str, variable: str, value: str, said: str
) -> None:
    status, stderr, took = _taotrace(command, "--port", "0", env=_env(**{variable: value}))
    assert (status, stderr.splitlines()) == (2, [f"taotrace {command}: error: {said}"])
    assert took < REFUSED_WITHIN


@pytest.mark.parametrize("mode", ["one process", "--workers 2"])
def test_an_exporter_that_cannot_start_stops_serve_in_one_line(mode: str, tmp_path: Path) -> None:
    """Installed (the variables' check passes), but it fails when made: the same one line, exit 2."""
    (tmp_path / "broken_exporter.py").write_text(
        "from opentelemetry.sdk.trace.export import SpanExporter\n"
        "class Broken(SpanExporter):\n"
        "    def __init__(self):\n"
        "        raise RuntimeError('no endpoint configured')\n"
    )
    info = tmp_path / "broken_exporter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: broken-exporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[opentelemetry_traces_exporter]\nbroken = broken_exporter:Broken\n")
    env = _env(OTEL_TRACES_EXPORTER="broken", PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}")
    status, stderr, took = _taotrace("serve", "--port", "0", "--metrics-port", "0", *MODES[mode], env=env)
    assert status == 2, stderr
    lines = [LOG_PREFIX.sub("", line) for line in stderr.splitlines()]
    assert lines == ["OTEL_TRACES_EXPORTER=broken: the exporter could not start (RuntimeError)"]
    assert took < REFUSED_WITHIN


@pytest.mark.timeout(90)
@pytest.mark.parametrize("mode", ["one process", "--workers 2"])
def test_otel_variables_taotrace_does_not_honour_are_warned_about_once(mode: str, tmp_path: Path) -> None:
    """Said once by the command (a group's workers inherit the environment, judged in the parent),
    and the start goes on; an exporter plug-in and the console are both named in the start-up line."""
    info = tmp_path / "fake_exporter-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: fake-exporter\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text(
        "[opentelemetry_traces_exporter]\nfakezipkin = opentelemetry.sdk.trace.export:ConsoleSpanExporter\n"
    )
    env = _env(
        OTEL_LOGS_EXPORTER="otlp", OTEL_SERVCE_NAME="not-shown", OTEL_TRACES_EXPORTER="console,fakezipkin",
        PYTHONPATH=f"{ROOT}{os.pathsep}{tmp_path}",
    )  # fmt: skip
    serving = _Serving("--port", "0", "--metrics-port", "0", *MODES[mode], env=env)
    try:
        line = serving.started()
        text = serving.text()
    finally:
        assert serving.stop() == 0
    assert [x for x in text.splitlines() if "warning:" in x or "WARNING" in x] == [
        "taotrace serve: warning: OTEL_LOGS_EXPORTER is not honoured: taotrace sends no logs through OpenTelemetry "
        "(its log lines go to stderr)",
        "taotrace serve: warning: OTEL_SERVCE_NAME is not an OpenTelemetry variable taotrace knows, and is ignored; "
        "did you mean OTEL_SERVICE_NAME?",
    ]
    assert line.endswith(
        "; spans printed to stdout (OTEL_TRACES_EXPORTER=console) and through the fakezipkin exporter "
        "(OTEL_TRACES_EXPORTER=fakezipkin, its own settings)"
    ), line
    assert "not-shown" not in text


@pytest.mark.parametrize(
    "command,variable,meant",
    [
        ("sim", "TAOTRACE_SIM_TIMESCALE", "TAOTRACE_SIM_TIME_SCALE"),
        ("demo", "TAOTRACE_DEMO_ONCEE", "TAOTRACE_DEMO_ONCE"),
    ],
)
def test_sim_and_demo_warn_too(command: str, variable: str, meant: str) -> None:
    # `--port 99999` is refused, so the command ends right after reading its settings
    status, stderr, _ = _taotrace(command, "--port", "99999", env=_env(**{variable: "value-not-shown"}))
    assert status == 2
    assert stderr.splitlines()[0] == (
        f"taotrace {command}: warning: {variable} is not a taotrace setting and is ignored; did you mean {meant}?"
    )
    assert "value-not-shown" not in stderr


def test_known_names_of_any_command_are_not_warned_about_and_strangers_get_no_guess() -> None:
    serve = Flags(settings_class(next(c for c in COMMANDS if c.name == "serve")), ArgumentParser("taotrace serve"))
    environ = {
        "TAOTRACE_SIM_PORT": "1", "TAOTRACE_API_KEY": "k", "TAOTOKEN_API_KEY": "k", "TAOTRACE_MODEL": "m",
        "taotrace_port": "1", "TAOTRACE_DEMO_ONCE": "1", "PATH": "/bin",
    }  # fmt: skip
    assert unknown_variable_warnings(serve, environ) == []
    assert unknown_variable_warnings(serve, {**environ, "TAOTRACE_ZZZ": "1"}) == [
        "taotrace serve: warning: TAOTRACE_ZZZ is not a taotrace setting and is ignored"
    ]
    assert unknown_variable_warnings(serve, {"taotrace_upstrem": "1", "OTHER_UPSTREM": "1"}) == [
        "taotrace serve: warning: taotrace_upstrem is not a taotrace setting and is ignored; "
        "did you mean TAOTRACE_UPSTREAM?"
    ]


@pytest.mark.parametrize(
    "env,said",
    [
        ({}, "spans not exported (set OTEL_EXPORTER_OTLP_ENDPOINT)"),
        ({"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "spans not exported (OTEL_TRACES_EXPORTER=none)"),
        ({"OTEL_TRACES_EXPORTER": "console"}, "spans printed to stdout (OTEL_TRACES_EXPORTER=console)"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318/"}, "spans to http://c:4318/v1/traces (OTLP http/protobuf)"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://t.example/x"}, "spans to https://t.example/x (OTLP http/protobuf)"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "spans to http://c:4317 (OTLP grpc)"),
        ({"OTEL_EXPORTER_OTLP_ENDPOINT": "u:p@c:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, "spans to c:4317 (OTLP grpc)"),
        ({"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://u:p@[::1]:4318/v1/traces?k=v#f"}, "spans to https://[::1]:4318/v1/traces (OTLP http/protobuf)"),
        # A list: every exporter, in order; one named for its protocol fixes it.
        ({"OTEL_TRACES_EXPORTER": "otlp,console", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "spans to http://c:4318/v1/traces (OTLP http/protobuf) and printed to stdout (OTEL_TRACES_EXPORTER=console)"),
        ({"OTEL_TRACES_EXPORTER": "console,otlp"}, "spans printed to stdout (OTEL_TRACES_EXPORTER=console); not over OTLP (set OTEL_EXPORTER_OTLP_ENDPOINT)"),
        ({"OTEL_TRACES_EXPORTER": "otlp_proto_grpc", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4317"}, "spans to http://c:4317 (OTLP grpc)"),
        ({"OTEL_TRACES_EXPORTER": "zipkin"}, "spans through the zipkin exporter (OTEL_TRACES_EXPORTER=zipkin, its own settings)"),
        ({"OTEL_SDK_DISABLED": "true", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://c:4318"}, "spans not exported (OTEL_SDK_DISABLED=true)"),
    ],
)  # fmt: skip
def test_span_destination_as_the_exporter_resolves_it(env: dict[str, str], said: str) -> None:
    assert span_destination(env) == said


def test_shown_endpoint_keeps_no_userinfo_or_query() -> None:
    assert shown_endpoint("https://key:secret@collector:4318/otlp?api_key=secret") == "https://collector:4318/otlp"
    assert "secret" not in shown_endpoint("http://[bad")


def test_refusal_wording_names_the_flag_to_change() -> None:
    def said(error: OSError) -> str:
        return refusal("0.0.0.0", 80, error, port_flag="--port", host_flag="--host")

    assert said(OSError(errno.EACCES, "Permission denied")) == (
        "cannot listen on 0.0.0.0:80: permission denied (ports below 1024 need privileges; choose another port with --port)"
    )
    assert said(OSError(errno.EADDRNOTAVAIL, "x")).endswith("(not an address of this host; change --host)")
    assert (
        said(socket.gaierror(-2, "Name or service not known"))
        == "cannot listen on 0.0.0.0:80: unknown host (change --host)"
    )
    assert refusal("::1", 9, OSError(errno.EADDRINUSE, "x"), port_flag="--p", host_flag="--h").startswith(
        "cannot listen on [::1]:9: address already in use"
    )


def test_bind_refuses_with_cannot_listen_and_leaves_nothing_bound() -> None:
    with _taken() as port:
        with pytest.raises(CannotListen) as raised:
            bind("127.0.0.1", port, port_flag="--metrics-port", host_flag="--metrics-host")
    assert isinstance(raised.value, OSError) and str(raised.value) == _refused(port, "--metrics-port")
    assert str(raised.value.named(port_flag="--sim-port")) == _refused(port, "--sim-port")
    socks = bind("127.0.0.1", 0, port_flag="--port", host_flag="--host")
    try:
        assert len(socks) == 1 and socks[0].getsockname()[1] != 0
    finally:
        for sock in socks:
            sock.close()


def test_exposed_means_any_address_off_loopback() -> None:
    assert not exposed(["127.0.0.1", "::1"])
    assert exposed(["0.0.0.0"]) and exposed(["::"]) and exposed(["127.0.0.1", "192.168.1.5"])


def test_an_open_unguarded_live_view_is_warned_of_in_the_commands_own_flags() -> None:
    """serve's warning, and demo's (its --host is where the view listens; it has no --no-ui)."""
    url = "http://0.0.0.0:9464"
    said = live_view_warning(url, ["0.0.0.0"], ui=True, token=False, capture_content=False)
    assert said == (
        f"the live view on {url}/ is open to anyone who can reach this address and shows every request; "
        "set TAOTRACE_UI_TOKEN, listen on 127.0.0.1 (--metrics-host), or turn it off (--no-ui)"
    )
    demo = live_view_warning(
        url, ["0.0.0.0"], ui=True, token=False, capture_content=False, listen_flag="--host", off_flag=None
    )
    assert demo is not None and demo.endswith(
        "shows every request; set TAOTRACE_UI_TOKEN, or listen on 127.0.0.1 (--host)"
    )
    for quiet in (
        live_view_warning(url, ["127.0.0.1", "::1"], ui=True, token=False, capture_content=False),
        live_view_warning(url, ["0.0.0.0"], ui=True, token=True, capture_content=False),
        live_view_warning(url, ["0.0.0.0"], ui=False, token=False, capture_content=False),
    ):
        assert quiet is None


def _in_private_network(*args: str, env: Mapping[str, str]) -> subprocess.CompletedProcess[str]:
    """`python -m proxy ARGS` in a network namespace of its own (loopback only, up), where binding
    0.0.0.0 reaches nothing outside it. Skips where such a namespace cannot be made."""
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("needs unshare and ip (util-linux, iproute2) for a private network namespace")
    probe = subprocess.run(["unshare", "-rn", "ip", "link", "set", "lo", "up"], capture_output=True, timeout=10)
    if probe.returncode != 0:
        pytest.skip("cannot create a network namespace here")
    script = 'ip link set lo up && exec "$@"'
    return subprocess.run(
        ["unshare", "-rn", "sh", "-c", script, "sh", sys.executable, "-m", "proxy", *args],
        cwd=ROOT, env=dict(env), capture_output=True, text=True, timeout=90,
    )  # fmt: skip


@pytest.mark.timeout(120)
def test_demo_on_an_open_host_warns_of_its_live_view_unless_a_token_guards_it() -> None:
    args = ("demo", "--once", "--host", "0.0.0.0", "--time-scale", "0.3", "--max-tokens", "4",
            "--base-tokens", "100", "--cache-tokens", "200")  # fmt: skip
    open_view = _in_private_network(*args, env=_env())
    assert open_view.returncode == 0, open_view.stderr
    warnings = [line for line in open_view.stderr.splitlines() if "warning" in line]
    assert len(warnings) == 1 and re.fullmatch(
        r"demo: warning: the live view on http://0\.0\.0\.0:\d+/ is open to anyone who can reach this address "
        r"and shows every request; set TAOTRACE_UI_TOKEN, or listen on 127\.0\.0\.1 \(--host\)",
        warnings[0],
    ), open_view.stderr
    guarded = _in_private_network(*args, env=_env(TAOTRACE_UI_TOKEN="a-token-for-the-live-view"))
    assert guarded.returncode == 0, guarded.stderr
    assert "warning" not in guarded.stderr and "a-token-for-the-live-view" not in guarded.stderr + guarded.stdout
