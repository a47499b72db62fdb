# The one image for the operator and the workers: `phoenix operator`, `phoenix worker`.
# A team's processors go in an image built FROM this one with their package installed on top
# (`/opt/phoenix/bin/pip` is not there: install with a pip of the builder's, `pip --python /opt/phoenix/bin/python`).
#
# BASE_IMAGE pins the Python base, a 3.13 (the lock files hold wheels for it: Makefile `lock`); for a reproducible
# build give it by digest:
#   docker build --build-arg BASE_IMAGE=python:3.13-slim@sha256:<digest> .
# (the e2e builds a Debian equivalent locally, since python:3.13-slim cannot be pulled there).
# Every Python package comes from requirements.lock (runtime) and requirements-build.lock (the build backend), both
# with hashes (`make lock` regenerates them from pyproject.toml); pip refuses anything else.
ARG BASE_IMAGE=python:3.13-slim
FROM ${BASE_IMAGE} AS build
WORKDIR /src
# Virtualenvs without pip: the base's pip installs into them (--python), so none is copied into the final image.
RUN python3 -m venv --without-pip /opt/phoenix && python3 -m venv --without-pip /opt/build
COPY requirements.lock requirements-build.lock ./
RUN pip --python /opt/phoenix/bin/python install --no-cache-dir --require-hashes --no-deps -r requirements.lock \
    && pip --python /opt/build/bin/python install --no-cache-dir --require-hashes --no-deps -r requirements-build.lock
COPY pyproject.toml README.md ./
COPY phoenix ./phoenix
# The wheel is built with the locked setuptools (no isolated build fetching an unpinned one), then installed alone.
RUN pip --python /opt/build/bin/python wheel --no-cache-dir --no-deps --no-build-isolation --wheel-dir /wheels . \
    && pip --python /opt/phoenix/bin/python install --no-cache-dir --no-deps /wheels/*.whl

FROM ${BASE_IMAGE}
# The router reads scanned pages with Tesseract OCR. pip and setuptools of the base go: nothing installs at run
# time (python:3.13-slim has them in /usr/local, a Debian base as packages).
RUN apt-get update && apt-get install -y --no-install-recommends tesseract-ocr tesseract-ocr-eng \
    && if dpkg-query -W python3-pip >/dev/null 2>&1; then \
         apt-get purge -y --auto-remove python3-pip python3-setuptools python3-wheel; fi \
    && rm -rf /var/lib/apt/lists/* /usr/local/bin/pip* /usr/local/lib/python3*/site-packages/pip* \
       /usr/local/lib/python3*/site-packages/setuptools* /usr/local/lib/python3*/site-packages/wheel* \
       /usr/local/lib/python3*/site-packages/pkg_resources /usr/local/lib/python3*/site-packages/_distutils_hack \
       /usr/local/lib/python3*/site-packages/distutils-precedence.pth \
    && ! python3 -c 'import pip' 2>/dev/null && ! python3 -c 'import setuptools' 2>/dev/null
# The uid the manifests' securityContext runs as (runAsNonRoot, read-only root filesystem).
RUN useradd --uid 65532 --no-create-home --shell /usr/sbin/nologin phoenix
COPY --from=build /opt/phoenix /opt/phoenix
ENV PATH=/opt/phoenix/bin:$PATH PYTHONDONTWRITEBYTECODE=1 PYTHONUNBUFFERED=1
USER 65532:65532
ENTRYPOINT ["phoenix"]
CMD ["worker"]
