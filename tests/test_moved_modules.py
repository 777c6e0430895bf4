"""The previous release's module paths still import, for one release, with a DeprecationWarning."""

from __future__ import annotations

import importlib
import sys

import pytest

from vitdeploy import MOVED_MODULES


@pytest.mark.parametrize("old", sorted(MOVED_MODULES))
def test_an_old_path_is_the_new_module_and_says_where_it_went(old):
    sys.modules.pop(old, None)
    with pytest.warns(DeprecationWarning, match=f"{old} moved to {MOVED_MODULES[old]}"):
        module = importlib.import_module(old)
    assert module is importlib.import_module(MOVED_MODULES[old])
