# One image for the web process and the CPU workers. GPU workers (vLLM) get their own image (Dockerfile.gpu):
# vLLM pins its own torch and transformers versions.
FROM python:3.11-slim
ENV PYTHONUNBUFFERED=1 PIP_NO_CACHE_DIR=1 DEBUG=false STUDIO_DATA_DIR=/var/lib/studio \
    STUDIO_STATIC_ROOT=/app/staticfiles
WORKDIR /app
# bubblewrap: the process sandbox backend that runs model-written code in the rollout and verify workers.
# postgresql-client: pg_dump and pg_restore for `manage.py backup` and `restore` (Debian's: the major version of
# docker-compose.yml's postgres or newer, which is what pg_dump needs).
RUN apt-get update && apt-get install -y --no-install-recommends bubblewrap postgresql-client \
    && rm -rf /var/lib/apt/lists/*
COPY pyproject.toml README.md ./
COPY studio studio
COPY apps apps
COPY workers workers
RUN pip install .
COPY manage.py ./
COPY templates templates
COPY static static
RUN SECRET_KEY=build-only python manage.py collectstatic --noinput
EXPOSE 8000
CMD ["daphne", "-b", "0.0.0.0", "-p", "8000", "studio.asgi:application"]
