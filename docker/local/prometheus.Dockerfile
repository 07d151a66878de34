# A local stand-in for prom/prometheus:v2.42.0 (`make compose-test`, no registry reachable): Debian bookworm's
# Prometheus 2.42, run as nobody like the official image, with wget for docker-compose.yml's healthcheck.
ARG DEBIAN_IMAGE=director-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# hadolint ignore=DL3008 # because the Debian release pins these packages' versions
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /prometheus && chown nobody:nogroup /prometheus
USER 65534:65534
VOLUME ["/prometheus"]
EXPOSE 9090
ENTRYPOINT ["/usr/bin/prometheus"]
CMD ["--config.file=/etc/prometheus/prometheus.yml", "--storage.tsdb.path=/prometheus"]
