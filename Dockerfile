# The forge image: the cluster controller (`forge up` on Kubernetes) and sandboxes that need forge inside.
FROM python:3.11-slim

RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap git ca-certificates \
    && rm -rf /var/lib/apt/lists/*

WORKDIR /opt/openforge
# torch first, pinned; the CPU wheel by default. The cluster's trainer image (deploy/k8s/cluster, NCCL)
# takes a CUDA one: --build-arg TORCH_INDEX=https://download.pytorch.org/whl/cu128 (docs/cluster.md).
# SGLang itself runs in its own image (docs/gpu.md).
ARG TORCH_INDEX=https://download.pytorch.org/whl/cpu
RUN pip install --no-cache-dir torch==2.13.0 --index-url ${TORCH_INDEX}
COPY pyproject.toml README.md ./
COPY openforge ./openforge
COPY forge_cli ./forge_cli
COPY engine ./engine
COPY proxy ./proxy
COPY sandbox ./sandbox
COPY rollouts ./rollouts
COPY trainer ./trainer
COPY runs ./runs
COPY bench ./bench
# [router]: sglang-router, the cluster's router Deployment runs it from this image
RUN pip install --no-cache-dir ".[k8s,router]"

# A non-root user (uid 1000, as `sandbox.kubernetes.run_as_user`): the namespace enforces Pod Security
# `restricted`, rollout pods run as it with a read-only root, and so does the controller.
RUN groupadd --gid 1000 forge && useradd --uid 1000 --gid 1000 --create-home --home-dir /home/forge forge \
    && mkdir -p /data && chown 1000:1000 /data
ENV FORGE_HOME=/data
VOLUME /data
USER 1000:1000
ENTRYPOINT ["forge"]
CMD ["--help"]
