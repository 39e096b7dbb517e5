# The forge image: the cluster controller (`forge up` on Kubernetes) and sandboxes that need forge inside.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/openforge
# torch first, pinned to the CPU wheel; GPU clusters run SGLang in its own image (docs/gpu.md).
RUN pip install --no-cache-dir torch==2.13.0 --index-url https://download.pytorch.org/whl/cpu
COPY pyproject.toml README.md ./
COPY openforge ./openforge
COPY forge_cli ./forge_cli
COPY engine ./engine
COPY proxy ./proxy
COPY sandbox ./sandbox
COPY rollouts ./rollouts
COPY trainer ./trainer
COPY bench ./bench
RUN pip install --no-cache-dir ".[k8s]"

ENV FORGE_HOME=/data
VOLUME /data
ENTRYPOINT ["forge"]
CMD ["--help"]
