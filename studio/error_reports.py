"""What a debug page or an error e-mail may show of the settings: Django hides names with API, TOKEN, KEY, SECRET,
PASS or SIGNATURE; connection URLs carry passwords too (postgres://user:password@host/db), so names with URL or
DSN are hidden as well."""

import re

from django.views.debug import SafeExceptionReporterFilter


class StudioExceptionReporterFilter(SafeExceptionReporterFilter):
    hidden_settings = re.compile("API|TOKEN|KEY|SECRET|PASS|SIGNATURE|HTTP_COOKIE|URL|DSN", flags=re.I)
