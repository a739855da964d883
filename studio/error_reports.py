"""What a debug page or an error e-mail may show of the settings: Django hides names with API, TOKEN, KEY, SECRET,
PASS or SIGNATURE; connection URLs carry passwords too (postgres://user:password@host/db), so names with URL or
DSN are hidden as well, and so is the user:password part of a URL anywhere else (the channel layer's hosts, the
Celery result backend)."""

import re

from django.views.debug import SafeExceptionReporterFilter

CREDENTIALS = re.compile(r"(?<=://)[^/@\s]+@")


class StudioExceptionReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile("API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN", flags=re.I)

    def cleanse_setting(self, key, value):
        cleansed = super().cleanse_setting(key, value)  # recurses into dicts and lists through this method
        if type(cleansed) is str:  # not the lazy placeholder (which passes isinstance)
            return CREDENTIALS.sub(f"{self.cleansed_substitute}@", cleansed)
        return cleansed
