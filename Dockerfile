# kvemu image: router and replicas (target `server`), Locust master/worker (target `locust`).
#
#   docker build --target server -t kvemu:latest .
#   docker build --target locust -t kvemu-locust:latest .
#
# docker-compose.yml builds both and defines the healthchecks (GET /health).  Processes bind
# 0.0.0.0 only because the compose commands pass `--host 0.0.0.0`; the code's default is loopback.
FROM python:3.11-slim AS server

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /app

# Only what the package needs (no .git, no virtualenvs, no test data). setup.py builds the compiled
# block pool (the simulator's fast path) with the compiler installed for the build and removed after.
COPY pyproject.toml setup.py README.md ./
COPY kvemu ./kvemu
COPY router ./router
COPY replica ./replica
COPY shared ./shared
COPY loadgen ./loadgen
COPY sim ./sim
RUN apt-get update -qq && apt-get install -y -qq --no-install-recommends gcc libc6-dev >/dev/null \
    && pip install . \
    && apt-get purge -y -qq gcc libc6-dev >/dev/null && apt-get autoremove -y -qq >/dev/null \
    && rm -rf /var/lib/apt/lists/* \
    && useradd --create-home --uid 10001 --shell /usr/sbin/nologin kvemu

USER kvemu

# router 8000; replica-0..2 8100-8102
EXPOSE 8000 8100 8101 8102

CMD ["kvemu", "--help"]


FROM server AS locust

USER root
RUN pip install ".[locust]"
USER kvemu

# Locust web UI 8089; master <-> worker 5557
EXPOSE 8089 5557

CMD ["locust", "-f", "loadgen/locustfile.py"]
