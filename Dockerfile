# syntax=docker/dockerfile:1
# The LinReBoot decision service. Redis runs elsewhere (see docker-compose.yml);
# without REDIS_URL the service starts an embedded Redis in /srv/linreboot/data.

FROM python:3.11-slim AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY policies ./policies
COPY service ./service
COPY app ./app
COPY loadtest ./loadtest
COPY linreboot ./linreboot
RUN pip wheel --no-cache-dir --no-deps --wheel-dir /wheels .

FROM python:3.11-slim
ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    LINREBOOT_DATA_DIR=/srv/linreboot/data
COPY --from=build /wheels /wheels
RUN pip install /wheels/*.whl && rm -rf /wheels
RUN useradd --create-home --uid 10001 --shell /usr/sbin/nologin linreboot \
    && mkdir -p /srv/linreboot/data \
    && chown -R linreboot:linreboot /srv/linreboot
WORKDIR /srv/linreboot
USER linreboot

EXPOSE 8000
HEALTHCHECK --interval=15s --timeout=3s --start-period=20s --retries=3 \
    CMD ["python", "-c", "import urllib.request; urllib.request.urlopen('http://127.0.0.1:8000/healthz', timeout=2)"]
CMD ["linreboot", "serve", "--host", "0.0.0.0", "--port", "8000"]
