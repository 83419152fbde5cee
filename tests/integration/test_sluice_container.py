"""broker.testing.SluiceContainer's own promises, beyond what the rest of the suite uses: a broker that cannot start
fails the start with its log, and an image that is not there says how to build it."""

from __future__ import annotations

import pytest
from sluice_containers import LABEL, SESSION

from broker.errors import ServiceNotAvailableError
from broker.testing import SluiceContainer

pytestmark = pytest.mark.integration


def test_a_broker_that_exits_before_ready_fails_the_start_with_its_log(broker_image: str) -> None:
    container = SluiceContainer(
        broker_image, broker_args=("--config", "/nonexistent/broker.toml"), labels={LABEL: SESSION}
    )
    with pytest.raises(ServiceNotAvailableError) as caught, container:
        pass
    assert "exited before it was ready" in caught.value.message
    assert "cannot read config file /nonexistent/broker.toml" in caught.value.message  # the broker's own words


def test_a_missing_image_says_how_to_build_it(docker_client: object) -> None:
    with pytest.raises(ServiceNotAvailableError) as caught, SluiceContainer("sluice-broker:no-such-build"):
        pass
    assert "make image" in caught.value.message and "SLUICE_IMAGE" in caught.value.message
