# A local stand-in for the postgres:15-bookworm image (`make compose-test`, no registry reachable): Debian's
# PostgreSQL 15, with an entrypoint that honours the official image's POSTGRES_USER / POSTGRES_PASSWORD /
# POSTGRES_DB on first start, so docker-compose.yml runs it unchanged.
ARG DEBIAN_IMAGE=director-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
# hadolint ignore=DL3008 # because the Debian release pins these packages' versions
RUN apt-get update \
    && apt-get install -y --no-install-recommends postgresql-15 \
    && rm -rf /var/lib/apt/lists/* \
    && mkdir -p /var/lib/postgresql/data /var/run/postgresql \
    && chown -R postgres:postgres /var/lib/postgresql /var/run/postgresql \
    && chmod 700 /var/lib/postgresql/data
COPY postgres-entrypoint.sh /usr/local/bin/postgres-entrypoint.sh
ENV PATH=/usr/lib/postgresql/15/bin:$PATH \
    PGDATA=/var/lib/postgresql/data
USER postgres
VOLUME ["/var/lib/postgresql/data"]
EXPOSE 5432
STOPSIGNAL SIGINT
ENTRYPOINT ["/usr/local/bin/postgres-entrypoint.sh"]
