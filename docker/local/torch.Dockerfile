# A local stand-in for the pytorch/pytorch base image, for a machine that reaches no image registry
# (`make compose-test`): Debian bookworm's Python 3.11 in a virtual environment, with the pinned torch installed from
# a wheel folder that the build reaches over HTTP on the host (WHEELS_URL, `docker build --network host`), so the
# wheels never become a layer of their own. The pin is pyproject.toml's; docker/Dockerfile checks it again.
# The build context holds one file, ca-certificates.crt: the host's trust store, which pip in the images built on
# this one uses, so that they reach the package index through the same TLS-inspecting proxy as the host does.
ARG DEBIAN_IMAGE=director-local/debian:bookworm
FROM ${DEBIAN_IMAGE}
ARG TORCH_VERSION=2.14.1
ARG WHEELS_URL
ENV PATH=/opt/venv/bin:$PATH \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1
# hadolint ignore=DL3008 # because the Debian release pins these packages' versions
RUN apt-get update \
    && apt-get install -y --no-install-recommends python3 python3-venv \
    && rm -rf /var/lib/apt/lists/* \
    && python3 -m venv /opt/venv
RUN pip install --no-index --find-links "${WHEELS_URL}" "torch==${TORCH_VERSION}" \
    && python -c "import torch; print('torch', torch.__version__)"
COPY ca-certificates.crt /etc/ssl/host-ca-certificates.crt
ENV PIP_CERT=/etc/ssl/host-ca-certificates.crt \
    SSL_CERT_FILE=/etc/ssl/host-ca-certificates.crt
