"""Form fields the apps share."""

from django import forms

from workers.definitions.newlines import normalise_newlines


class MultilineField(forms.CharField):
    """A textarea's text with "\\n" line endings. Browsers submit a textarea's lines ending in "\\r\\n"; what the
    studio stores and parses is written for "\\n" (workers/definitions/newlines.py), so every form field that takes
    more than one line is this one."""

    widget = forms.Textarea

    def to_python(self, value):
        return normalise_newlines(super().to_python(value))
