# syntax=docker/dockerfile:1
# The LinReBoot decision service. Redis runs elsewhere (see docker-compose.yml):
# set REDIS_URL and LINREBOOT_ADMIN_TOKEN. The image has no embedded Redis and
# no plotting (the [embedded] and [plots] extras are for development).

# A pinned base (a Python patch release on a Debian release), and dependencies
# pinned by requirements.lock: the same build tomorrow as today.
FROM python:3.11.11-slim-bookworm AS build
WORKDIR /src
# The dependencies from the lock alone: a change to the code reuses this layer.
COPY pyproject.toml requirements.lock ./
RUN pip wheel --no-cache-dir --wheel-dir /wheels/deps -r requirements.lock
COPY README.md LICENSE ./
COPY policies ./policies
COPY service ./service
COPY app ./app
COPY loadtest ./loadtest
COPY linreboot ./linreboot
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels/app .

FROM python:3.11.11-slim-bookworm
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
RUN useradd --uid 10001 --user-group --create-home --shell /usr/sbin/nologin linreboot
# Dependencies, then the service: each layer changes only when what it installs does.
RUN --mount=type=bind,from=build,source=/wheels/deps,target=/tmp/wheels \
    pip install --no-index /tmp/wheels/*.whl
RUN --mount=type=bind,from=build,source=/wheels/app,target=/tmp/wheels \
    pip install --no-index --no-deps /tmp/wheels/*.whl
WORKDIR /home/linreboot
# Numeric, so that a runtime that refuses root (Kubernetes runAsNonRoot) can check it.
USER 10001:10001

EXPOSE 8000
# Healthy once Redis answers: /readyz is 503 while it does not (/healthz only says
# the process is up), so Compose's depends_on and orchestrators wait for a serving
# service; Docker itself never restarts an unhealthy container.
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/readyz', timeout=2)"]
CMD ["linreboot", "serve", "--host", "0.0.0.0", "--port", "8000"]
