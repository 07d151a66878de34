# A local stand-in for prom/alertmanager:v0.25.0 (`make compose-test`, no registry reachable): Debian bookworm's
# Alertmanager 0.25, run as nobody like the official image, with wget for docker-compose.yml's healthcheck.
ARG DEBIAN_IMAGE=director-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# hadolint ignore=DL3008 # because the Debian release pins these packages' versions
RUN apt-get update \
    && apt-get install -y --no-install-recommends prometheus-alertmanager wget \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /alertmanager && chown nobody:nogroup /alertmanager
USER 65534:65534
VOLUME ["/alertmanager"]
EXPOSE 9093
ENTRYPOINT ["/usr/bin/prometheus-alertmanager"]
CMD ["--config.file=/etc/alertmanager/alertmanager.yml", "--storage.path=/alertmanager"]
