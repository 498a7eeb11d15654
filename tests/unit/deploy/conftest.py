"""pytest wiring for the deploy/ tests: the `helm` fixture and the opt-in marker.

The collector build takes several minutes cold, so tests marked `collector_build` are
left out of the default run. They run when the -m expression names the marker
(`pytest -m collector_build`, as `make collector-build` does) or with
RUN_COLLECTOR_BUILD=1.
"""

from __future__ import annotations

import os

import pytest

from tests.unit.deploy.helpers import Helm, build_tool


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line(
        "markers",
        "collector_build: builds the OpenTelemetry Collector distribution with ocb "
        "(several minutes cold); opt-in: -m collector_build or RUN_COLLECTOR_BUILD=1",
    )


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    if "collector_build" in (config.option.markexpr or "") or os.environ.get("RUN_COLLECTOR_BUILD") == "1":
        return
    slow = [item for item in items if item.get_closest_marker("collector_build")]
    if slow:
        config.hook.pytest_deselected(items=slow)
        items[:] = [item for item in items if not item.get_closest_marker("collector_build")]


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(binary=build_tool("helm"), home=tmp_path_factory.mktemp("helm-home"))
