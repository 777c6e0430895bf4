"""`vitdeploy loadtest` against a server whose every answer the test decides (helpers/scripted_server.py):
counts, statuses with their example, percentiles, the open loop's honesty about a stall, the server's
statistics, the client-limit flag, the command's errors and its result saved beside the export (-a)."""

from __future__ import annotations

import json
import threading

import pytest
from click.testing import CliRunner
from helpers.scripted_server import ScriptedServer

from vitdeploy.base.errors import ConfigError
from vitdeploy.client.loadgen import LevelResult, closed_loop, due_times, open_loop
from vitdeploy.client.loadtest import (
    LoadPlan,
    client_limit,
    format_loadtest,
    parse_duration,
    parse_levels,
    run_loadtest,
)
from vitdeploy.client.protocols import PREDICT, V2_HTTP, Target, open_client

IMAGES = [b"\xff\xd8first", b"\xff\xd8second", b"\xff\xd8third"]


def test_a_closed_loop_counts_every_request_and_times_what_the_server_took():
    with ScriptedServer(delay_s=0.02, fail_every=5) as server:
        factory = lambda: open_client(Target(server.url, PREDICT))  # noqa: E731
        result = closed_loop(factory, IMAGES, clients=3, requests=40)
    assert result.sent == 40 == len(server.requests)
    assert result.statuses == {"200": 32, "503": 8}  # every fifth refused by the script
    assert result.errors == {"503": 8} and "refused by the script" in result.examples["503"]
    assert len(result.latencies_ms) == 32 and result.percentile(50) >= 20.0  # the server's 20 ms, at least
    assert result.throughput == pytest.approx(32 / result.seconds)
    assert {path for path, _, _ in server.requests} == {"/predict"}
    # each answered request with the time it came back (a window of the level is judged on those inside it)
    assert [ms for _, ms in result.timeline] == result.latencies_ms
    assert [t for t, _ in result.timeline] == sorted(t for t, _ in result.timeline)


def test_v2_http_sends_one_image_as_a_binary_tensor_and_the_token_as_a_bearer():
    with ScriptedServer() as server:
        factory = lambda: open_client(Target(server.url, V2_HTTP, "vit", token="s3cret"))  # noqa: E731
        result = closed_loop(factory, IMAGES, clients=1, requests=3)
    assert result.ok == 3
    path, headers, length = server.requests[0]
    assert path == "/v2/models/vit/infer" and headers["Authorization"] == "Bearer s3cret"
    head = int(headers["Inference-Header-Content-Length"])
    assert length == head + 4 + len(IMAGES[0])  # the JSON header, then one 4-byte length and the image


def test_the_open_loop_counts_a_servers_stall_in_every_request_due_meanwhile():
    """The server is held for 1 s: requests due during the hold are late by what remained of it (wrk2's
    coordinated omission). A closed loop of one client sees one slow request; the open loop sees many."""
    with ScriptedServer() as server:
        factory = lambda: open_client(Target(server.url, PREDICT))  # noqa: E731
        server.gate.clear()
        threading.Timer(1.0, server.gate.set).start()
        result = open_loop(factory, IMAGES, rate=50, requests=60, connections=4)
    assert result.ok == 60
    slow = [ms for ms in result.latencies_ms if ms >= 500]
    assert len(slow) >= 20  # due in the first 0.5 s of the hold, all answered after it ended
    assert result.percentile(100) >= 950 and result.backlog_max >= 10  # 4 connections busy, the rest queued
    with ScriptedServer() as server:
        factory = lambda: open_client(Target(server.url, PREDICT))  # noqa: E731
        server.gate.clear()
        threading.Timer(1.0, server.gate.set).start()
        closed = closed_loop(factory, IMAGES, clients=1, requests=20)
    assert sum(ms >= 500 for ms in closed.latencies_ms) == 1  # the same stall hides in one request


def test_due_times_are_even_or_a_seeded_poisson_process():
    assert due_times(4, 4, poisson=False) == [0.0, 0.25, 0.5, 0.75]
    gaps = due_times(100, 20_000, poisson=True, seed=3)
    assert gaps == due_times(100, 20_000, poisson=True, seed=3) and gaps[0] == 0.0
    assert gaps[-1] / (len(gaps) - 1) == pytest.approx(0.01, rel=0.03)  # mean gap 1/rate


def test_a_level_reads_the_servers_statistics_before_and_after_it():
    with ScriptedServer() as server:
        plan = LoadPlan(Target(server.url, V2_HTTP, "m"), IMAGES, concurrency=(2,), duration_s=None, requests=10)
        report = run_loadtest(plan)
    level = report.levels[0]
    assert level.server["requests"] == 10  # the warm-up's requests are not in the level
    assert level.server["queue_ms"] == 2.0 and level.server["compute_infer_ms"] == 5.0
    doc = report.to_dict()
    assert doc["target"]["token"] is False and doc["levels"][0]["ok"] == 10
    table = "\n".join(format_loadtest(report))
    assert "2 c" in table and "client and server share this machine" in table  # loopback: one machine


def test_statistics_that_record_a_success_after_answering_it_still_count_every_request():
    with ScriptedServer(stats_lag_s=0.5) as server:
        plan = LoadPlan(Target(server.url, V2_HTTP, "m"), IMAGES, (2,), duration_s=None, requests=6, warmup_s=0)
        level = run_loadtest(plan).levels[0]
    assert level.ok == 6 and level.server["requests"] == 6


def test_each_level_shows_the_servers_own_stage_split_from_its_headers():
    timing = 'read;dur=0.5, decode;dur=2, queue;dur=4, model;dur=3;desc="batch=6", post;dur=0.5, total;dur=10'
    with ScriptedServer(delay_s=0.02, fail_every=4, server_timing=timing) as server:
        plan = LoadPlan(
            Target(server.url, PREDICT), IMAGES, concurrency=(2,), duration_s=None, requests=12, warmup_s=0
        )
        report = run_loadtest(plan)
    stages = report.levels[0].stages
    assert stages["requests"] == 9  # the answered ones: every fourth was refused, without a header
    assert stages["queue"] == 4.0 and stages["model"] == 3.0 and stages["batch"] == 6.0 and stages["total"] == 10
    assert report.to_dict()["levels"][0]["server_timing_ms"]["decode"] == 2.0
    table = format_loadtest(report)
    at = table.index("server stage split (Server-Timing, mean ms per answered request):")
    assert table[at + 1].split() == ["level", "read", "decode", "queue", "model", "post", "total", "batch", "replica"]
    row = table[at + 2].split()
    assert row[:9] == ["2", "c", "0.50", "2.00", "4.00", "3.00", "0.50", "10.00", "6.0"]
    assert row[9].endswith("%") and 0 < int(row[9][:-1]) <= 50  # 10 ms of a >= 20 ms latency
    with ScriptedServer() as server:  # a server without the header (Triton): no split, no empty table
        plan = LoadPlan(Target(server.url, PREDICT), IMAGES, concurrency=(1,), duration_s=None, requests=3, warmup_s=0)
        assert not any("stage split" in line for line in format_loadtest(run_loadtest(plan)))


def test_a_client_near_its_limit_is_flagged_in_the_table():
    busy = LevelResult("concurrency", 64, seconds=10.0, client_cpu_s=9.0)
    assert "0.90 cores" in client_limit(busy, cores=16, shared=False)
    shared = LevelResult("concurrency", 8, seconds=10.0, client_cpu_s=8.2)  # 0.82 cores: below one core's limit
    assert client_limit(shared, cores=2, shared=False) is None
    assert "of the 2 cores it shares" in client_limit(shared, cores=2, shared=True)


def test_a_server_that_answers_nothing_is_one_clear_error():
    with ScriptedServer(fail_every=1) as server:
        plan = LoadPlan(Target(server.url, PREDICT), IMAGES, concurrency=(1,), requests=3, warmup_s=0.3)
        with pytest.raises(ConfigError, match=r"no request of the warm-up was answered \(\d+ x 503: .*refused"):
            run_loadtest(plan)


@pytest.mark.parametrize(
    "args, message",
    [
        (["--concurrency", "1,x"], "--concurrency '1,x': expected comma-separated positive numbers"),
        (["--rate", "0"], "--rate '0'"),
        (["--concurrency", "1", "--rate", "5"], "either --concurrency or --rate"),
        (["--duration", "soon"], "--duration 'soon': expected a positive duration"),
        (["--protocol", "v2-http"], "--protocol v2-http needs --model"),
        (["--images", "/nonexistent"], "--images /nonexistent: not a folder"),
    ],
)
def test_the_command_says_what_is_wrong_in_one_line(args, message):
    from vitdeploy.cli import main

    result = CliRunner().invoke(main, ["loadtest", "http://127.0.0.1:9", *args])
    assert result.exit_code == 2, result.output
    assert message in result.output and "Traceback" not in result.output


@pytest.mark.parametrize("command", [["loadtest", "http://127.0.0.1:9"], ["rollout", "http://127.0.0.1:9", "-a", "x"]])
def test_a_token_on_the_command_line_is_refused_in_one_line_naming_where_it_is_read(command):
    """A token in argv is in `ps` and the shell's history: refused before anything runs; the environment's is read."""
    from vitdeploy.cli import main
    from vitdeploy.serve.auth import TOKEN_ENV

    result = CliRunner().invoke(main, [*command, "--token", "s3cret-token-typed"], env={TOKEN_ENV: None})
    assert result.exit_code == 2, result.output
    (line,) = result.output.strip().splitlines()
    assert line.startswith("error: --token is refused") and TOKEN_ENV in line and "s3cret" not in line
    assert ("serve.token_file" in line) == (command[0] == "rollout")  # only rollout reads -c


def test_loadtest_sends_the_environments_token():
    from vitdeploy.cli import main
    from vitdeploy.serve.auth import TOKEN_ENV

    with ScriptedServer() as server:
        args = ["loadtest", server.url, "--requests", "3", "--warmup", "0", "--json"]
        result = CliRunner().invoke(main, args, env={TOKEN_ENV: "a-serve-token-of-32-characters-x"})
    assert result.exit_code == 0, result.output
    assert {h.get("Authorization") for _, h, _ in server.requests} == {"Bearer a-serve-token-of-32-characters-x"}


def test_durations_and_levels_parse():
    assert parse_duration("20s") == 20 and parse_duration("2m") == 120 and parse_duration("500ms") == 0.5
    assert parse_levels("1,4,16", "--concurrency") == (1, 4, 16)
    assert parse_levels("12.5", "--rate", float) == (12.5,)


def test_the_command_prints_json_with_each_level():
    from vitdeploy.cli import main

    with ScriptedServer(delay_s=0.005) as server:
        result = CliRunner().invoke(
            main, ["loadtest", server.url, "--rate", "40", "--requests", "20", "--warmup", "0", "--json"]
        )
    assert result.exit_code == 0, result.output
    doc = json.loads(result.stdout)
    assert doc["format"] == "vitdeploy-loadtest" and doc["levels"][0]["mode"] == "rate"
    assert doc["levels"][0]["requests"] == 20 and doc["levels"][0]["latency_ms"]["p50"] >= 5.0


def test_with_the_export_named_the_levels_are_saved_beside_it_and_its_report_shows_them(tiny_artifacts, tmp_path):
    """`loadtest -a EXPORT` keeps its result where `vitdeploy report` looks (loadtest-report.json) and refreshes
    the export's report.html, whose serving section then shows the server's split of each level."""
    import shutil

    from vitdeploy.cli import main

    pytest.importorskip("matplotlib", reason="matplotlib is not installed (the report extra)")
    export = tmp_path / "export"
    shutil.copytree(tiny_artifacts(), export)
    (export / "report.html").write_text("an older page")
    timing = 'read;dur=0.5, decode;dur=2, queue;dur=4, model;dur=3;desc="batch=6", post;dur=0.5, total;dur=10'
    with ScriptedServer(server_timing=timing) as server:
        args = ["loadtest", server.url, "-a", str(export), "--concurrency", "2", "--requests", "6", "--warmup", "0"]
        result = CliRunner().invoke(main, args)
    assert result.exit_code == 0, result.output
    saved = json.loads((export / "loadtest-report.json").read_text())
    assert saved["target"]["url"] == server.url and saved["created"]
    assert saved["levels"][0]["server_timing_ms"]["queue"] == 4.0 and saved["levels"][0]["latency_ms"]["mean"] > 0
    page = (export / "report.html").read_text()
    assert "Where a request's time goes" in page
    assert "<td>2 clients</td>" in page and "<td>4.00</td><td>3.00</td>" in page  # queue, model
    assert f"saved: {export / 'loadtest-report.json'}" in result.stderr
