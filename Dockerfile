# One image for the console (gunicorn, the default command) and the workers
# (`python manage.py acthelm_worker`). See docs/operations.md and docker-compose.yml.
FROM python:3.12-slim

ENV PYTHONDONTWRITEBYTECODE=1 \
    PYTHONUNBUFFERED=1 \
    PIP_NO_CACHE_DIR=1 \
    PIP_DISABLE_PIP_VERSION_CHECK=1 \
    PYTHONPATH=/app \
    DJANGO_SETTINGS_MODULE=acthelm_site.settings_production \
    ACTHELM_MEDIA_ROOT=/data/media \
    ACTHELM_LOG_FORMAT=json

WORKDIR /app
COPY . .
RUN pip install -c requirements.lock .

# Static files are collected into the image (whitenoise serves them). The key and the database
# URL exist for this step only: collectstatic neither signs anything nor connects.
RUN DJANGO_SECRET_KEY=collectstatic-only-not-a-secret-collectstatic-only-not-a-secret \
    DATABASE_URL=postgresql://build@localhost/build \
    python manage.py collectstatic --noinput

RUN useradd --system --uid 10001 --create-home --home-dir /home/acthelm acthelm \
    && mkdir -p /data/media \
    && chown acthelm:acthelm /data/media
USER acthelm

EXPOSE 8000
CMD ["gunicorn", "acthelm_site.wsgi", "--threads", "16", "--bind", "0.0.0.0:8000", "--access-logfile", "-"]
