"""Run every CoopContext test with every gateway this build has."""

from __future__ import annotations

import pytest

from tests.context.coop.support import gateway_or_skip
from turnloom.context import GatewayType


@pytest.fixture(params=list(GatewayType), ids=[g.value for g in GatewayType])
def gateway_type(request: pytest.FixtureRequest) -> GatewayType:
    """Each GatewayType; skipped with a reason when its gateway is not in this build."""
    return gateway_or_skip(GatewayType(request.param))
