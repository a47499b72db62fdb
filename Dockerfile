# The one image for the operator and the workers: `phoenix operator`, `phoenix worker`.
# A team's processors go in an image built FROM this one with their package installed on top.
# BASE_IMAGE only matters where python:3.11-slim cannot be pulled (the e2e builds a Debian equivalent locally).
ARG BASE_IMAGE=python:3.11-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
COPY pyproject.toml README.md ./
COPY phoenix ./phoenix
RUN pip wheel --no-cache-dir --wheel-dir /wheels .

FROM ${BASE_IMAGE}
# The router reads scanned pages with Tesseract OCR.
RUN apt-get update && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng \
    && rm -rf /var/lib/apt/lists/*
# The uid the manifests' securityContext runs as (runAsNonRoot, read-only root filesystem).
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin phoenix
COPY --from=build /wheels /wheels
RUN pip install --no-cache-dir /wheels/*.whl && rm -rf /wheels
ENV PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["phoenix"]
CMD ["worker"]
