"""pytest wiring for the deploy/ tests: the `helm` fixture and the opt-in marker.

The collector build takes several minutes cold, so tests marked `collector_build` are
left out of the default run. They run when the -m expression names the marker
(`pytest -m collector_build`, as `make collector-build` does) or with
RUN_COLLECTOR_BUILD=1.
"""

from __future__ import annotations

import pytest

from tests.unit.deploy.helpers import Helm, build_tool


@pytest.fixture(scope="session")
def helm(tmp_path_factory: pytest.TempPathFactory) -> Helm:
    return Helm(binary=build_tool("helm"), home=tmp_path_factory.mktemp("helm-home"))
