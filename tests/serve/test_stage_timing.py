"""The Server-Timing value a replica writes and what `vitdeploy loadtest` reads back (serve/stage_timing.py),
without a server; the real header on real answers: test_ray_app.py."""

from __future__ import annotations

import time

from vitdeploy.serve import stage_timing
from vitdeploy.serve.stage_timing import STAGES, TOTAL, StageClock, parse_server_timing


def test_the_laps_account_for_the_whole_request_and_read_back():
    clock = StageClock()
    time.sleep(0.002)
    clock.lap("read")
    time.sleep(0.003)
    # decode 1 ms and the model call 1 ms of what _classify took: the rest was waiting for the batch
    clock.batched({"compute_input": 1_000_000, "compute_infer": 1_000_000, "batch": 3})
    value = stage_timing.finish(clock, None)
    parsed = parse_server_timing(value)
    assert set(parsed) == {*STAGES, TOTAL, "batch"} and parsed["batch"] == 3
    assert 'model;dur=1.000;desc="batch=3"' in value
    assert parsed["read"] >= 2 and parsed["queue"] >= 1 - 1e-3 and parsed["decode"] == 1.0
    assert sum(parsed[s] for s in STAGES) >= 0.95 * parsed[TOTAL]
    assert sum(parsed[s] for s in STAGES) <= parsed[TOTAL] + 1e-3


def test_timing_off_writes_nothing():
    clock = stage_timing.start(False)
    stage_timing.lap(clock, "read")
    stage_timing.batched(clock, {"compute_infer": 5})
    assert clock is None and stage_timing.finish(clock, None) is None
    assert stage_timing.open_metrics(False, "m", "1", "ort") is None


def test_other_servers_headers_are_read_as_far_as_they_go():
    assert parse_server_timing(None) == {} and parse_server_timing("") == {}
    value = 'cache;desc="Cache Read";dur=23.2, db;dur=53, app;dur=47.2, miss, model;dur=oops, x;dur="1.5"'
    assert parse_server_timing(value) == {"cache": 23.2, "db": 53.0, "app": 47.2, "x": 1.5}
