"""The HTTP layer: FastAPI routes, wire schemas and error mapping over :mod:`service`.

Public surface: :func:`create_app`.
"""

from app.main import create_app

__all__ = ["create_app"]
