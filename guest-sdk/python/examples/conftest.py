"""Each example is an application of its own, whose module is `app` (as
componentize-py builds it) beside a `test_app`: forget the previous
example's before pytest imports the next one's tests from their directory."""

import sys

import pytest


def pytest_collectstart(collector):
    if isinstance(collector, pytest.Module):
        for name in ("app", "test_app"):
            sys.modules.pop(name, None)
