#!/bin/sh
# First start: initialise the cluster with POSTGRES_USER (superuser, password POSTGRES_PASSWORD) and create
# POSTGRES_DB, as the official image does; then run the server in the foreground on every interface of the
# container, password (scram-sha-256) required from the network. Arguments are the server's options (`-c name=value`).
set -eu
: "${POSTGRES_USER:=postgres}" "${POSTGRES_DB:=$POSTGRES_USER}"
if [ ! -s "$PGDATA/PG_VERSION" ]; then
    : "${POSTGRES_PASSWORD:?POSTGRES_PASSWORD is required}"
    pwfile=$(mktemp)
    printf '%s' "$POSTGRES_PASSWORD" > "$pwfile"
    initdb --pgdata="$PGDATA" --username="$POSTGRES_USER" --pwfile="$pwfile" \
        --auth-local=trust --auth-host=scram-sha-256 --encoding=UTF8 >/dev/null
    rm -f "$pwfile"
    echo "host all all all scram-sha-256" >> "$PGDATA/pg_hba.conf"
    # the server's own options (the container's command) apply to this first start too, as in the official image
    pg_ctl --pgdata="$PGDATA" --options="$* -c listen_addresses=''" --wait start >/dev/null
    if [ "$POSTGRES_DB" != postgres ]; then
        psql --username="$POSTGRES_USER" --dbname=postgres --quiet --no-psqlrc \
            --set=ON_ERROR_STOP=1 --set=db="$POSTGRES_DB" <<'SQL'
CREATE DATABASE :"db";
SQL
    fi
    pg_ctl --pgdata="$PGDATA" --mode=fast --wait stop >/dev/null
    echo "postgres-entrypoint: initialised $PGDATA for $POSTGRES_USER, database $POSTGRES_DB"
fi
exec postgres -D "$PGDATA" -c listen_addresses='*' "$@"
