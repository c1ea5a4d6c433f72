"""The HTTP routes, one module per resource; ``ROUTERS`` is what the app includes."""

from __future__ import annotations

from app.routes.decisions import router as decisions_router
from app.routes.experiments import router as experiments_router
from app.routes.health import router as health_router

# The decision routes first: a request is matched against routes in this order.
ROUTERS = (decisions_router, experiments_router, health_router)

__all__ = ["ROUTERS"]
