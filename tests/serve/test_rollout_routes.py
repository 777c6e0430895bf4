"""Where the proxy's guard sends a request of a model with several versions, and what it tells the replicas
(vitdeploy/serve/rollout/routes.py). Pure Python; the registry that says which version is live:
test_rollout_registry.py."""

from __future__ import annotations

import pytest

from vitdeploy.base.errors import NotFoundError
from vitdeploy.serve.rollout.routes import (
    SHADOW_HEADER,
    VERSIONS_HEADER,
    parse_shadow,
    parse_versions,
    routed,
    version_app,
    version_of_app,
    version_route,
)

SHADOWING = {
    "live": "/v2/models/m",
    "live_app": "m",
    "versions": [1, 2],
    "apps": {"1": "m", "2": "m@v2"},
    "shadow": {"app": "m@v2", "timeout_s": 5.0},
}


def test_each_version_has_its_application_and_route():
    assert (version_app("m", 1), version_route("m", 1)) == ("m", "/v2/models/m")
    assert (version_app("m", 3), version_route("m", 3)) == ("m@v3", "/v2/models/m/versions/3")
    assert [version_of_app("m", a) for a in ("m", "m@v3", "other@v3", "m@vx", "mm")] == [1, 3, None, None, None]


def test_a_model_with_one_version_is_routed_as_before():
    assert routed("/v2/models/m/infer", "POST", "m", None) == ("/v2/models/m/infer", [])


def test_unversioned_requests_go_to_the_live_version_and_inferences_are_tagged_for_a_copy():
    path, headers = routed("/v2/models/m/infer", "POST", "m", SHADOWING)
    assert path == "/v2/models/m/infer"
    assert dict(headers) == {VERSIONS_HEADER: "1,2", SHADOW_HEADER: "m@v2 5"}
    path, headers = routed("/v2/models/m/", "GET", "m", SHADOWING)  # metadata: listed versions, no copy
    assert path == "/v2/models/m/" and dict(headers) == {VERSIONS_HEADER: "1,2"}
    promoted = {**SHADOWING, "live": "/v2/models/m/versions/2", "live_app": "m@v2", "shadow": None}
    assert routed("/v2/models/m/predict", "POST", "m", promoted)[0] == "/v2/models/m/versions/2/predict"


def test_a_versioned_request_reaches_that_version_and_never_copies():
    path, headers = routed("/v2/models/m/versions/2/infer", "POST", "m", SHADOWING)
    assert path == "/v2/models/m/versions/2/infer" and SHADOW_HEADER not in dict(headers)
    with pytest.raises(NotFoundError, match="no version '7' .versions: 1, 2"):
        routed("/v2/models/m/versions/7/infer", "POST", "m", SHADOWING)


def test_a_copy_goes_only_to_a_version_of_the_same_model():
    assert parse_shadow("m@v2 5", "m").app == "m@v2"
    assert parse_shadow(b"m@v2 0.5", "m").timeout_s == 0.5
    for value in ("other@v2 5", "m 5", "m@v2", "m@v2 soon", "m@v2 0", None):
        assert parse_shadow(value, "m") is None, value
    assert parse_versions("2,1,x", "1") == ["1", "2"] and parse_versions(None, "3") == ["3"]


def test_a_split_promotion_sends_unversioned_requests_to_the_promoted_version_by_its_share():
    split = {**SHADOWING, "shadow": None, "split": {"app": "m@v2", "route": "/v2/models/m/versions/2", "share": 0.4}}
    draws = [i / 100 for i in range(100)]
    paths = [routed("/v2/models/m/infer", "POST", "m", split, d)[0] for d in draws]
    assert paths.count("/v2/models/m/versions/2/infer") == 40 and paths.count("/v2/models/m/infer") == 60
    assert routed("/v2/models/m/versions/1/infer", "POST", "m", split, 0.0)[0] == "/v2/models/m/versions/1/infer"
    assert routed("/v2/models/m/infer", "POST", "m", SHADOWING, 0.0)[0] == "/v2/models/m/infer"  # no split
