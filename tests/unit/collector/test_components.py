"""Every pipeline component has a unique name and the start/shutdown contract of its folder."""

from collector.config import ServiceConfig
from collector.pipeline.service import ToolwitnessService
from collector.processors.base import Component
from collector.receivers.base import Receiver


def test_components_follow_the_contract_and_have_unique_names() -> None:
    service = ToolwitnessService(ServiceConfig())
    components = [service.receiver, service.store, service.exporter, service.admin]
    assert isinstance(service.receiver, Receiver)
    for c in components:
        assert isinstance(c, Component), c
    names = [
        c.name
        for c in (
            *components,
            service.engine,
            service.checkpoint,
            service.watermarks,
            service.recovery,
            service.engine.decider,
        )
    ]
    assert len(names) == len(set(names)), names
