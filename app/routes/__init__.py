"""The HTTP routes, one module per resource; the app mounts ``FIRST_ROUTERS`` and ``ROUTERS``."""

from __future__ import annotations

from app.routes.decisions import router as decisions_router
from app.routes.experiments import router as experiments_router
from app.routes.health import router as health_router
from app.routes.ui import router as ui_router

# The decision routes are the hot path: the app mounts them as its own first
# routes (see app.main), the rest as included routers.
FIRST_ROUTERS = (decisions_router,)
ROUTERS = (experiments_router, health_router, ui_router)

__all__ = ["FIRST_ROUTERS", "ROUTERS"]
