import os

from django.core.wsgi import get_wsgi_application

from studio.data_dir import prepare_data_dir

os.environ.setdefault("DJANGO_SETTINGS_MODULE", "studio.settings")
application = get_wsgi_application()
prepare_data_dir()
