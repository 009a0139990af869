"""The WSGI entry point (gunicorn acthelm_site.wsgi). A server gets the production settings unless
DJANGO_SETTINGS_MODULE says otherwise: they need DJANGO_SECRET_KEY and DATABASE_URL and refuse to
start without them, so a forgotten variable never serves the development key with DEBUG on."""

import os

from django.core.wsgi import get_wsgi_application

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "acthelm_site.settings_production")
application = get_wsgi_application()
