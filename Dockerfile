# rocewatch: streaming RoCE fabric telemetry and anomaly detection.
#
#   docker build -t rocewatch .
#   docker run --rm rocewatch simulate /data/scenario --nodes 64
#
# docker-compose.yml runs the whole stack (Kafka, PostgreSQL, Grafana, simulator, detector).

FROM python:3.11-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1

WORKDIR /src

# Only what the package build needs (see [tool.setuptools.packages.find] in pyproject.toml).
COPY pyproject.toml README.md* ./
COPY rocewatch/ rocewatch/
COPY collector/ collector/
COPY detectors/ detectors/
COPY storage/ storage/
COPY actions/ actions/

# The [postgres] extra brings psycopg for the compose stack's storage.url.
RUN pip install ".[postgres]" \
    && rm -rf /src/build /src/*.egg-info \
    && rocewatch --help > /dev/null

# Unprivileged runtime user; the directories below become the compose stack's named volumes
# (Docker copies their ownership into a fresh volume, so the user can write there).
RUN useradd --system --uid 10001 --user-group --create-home --home-dir /home/rocewatch rocewatch \
    && mkdir -p /var/lib/rocewatch /data /etc/rocewatch \
    && chown rocewatch:rocewatch /var/lib/rocewatch /data

USER rocewatch
WORKDIR /home/rocewatch

# Prometheus metrics (metrics_port in the config).
EXPOSE 9464

ENTRYPOINT ["rocewatch"]
CMD ["--help"]
