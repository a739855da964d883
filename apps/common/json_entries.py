"""`{% for key, value in event.details|entries %}`: the (key, value) pairs of a dict that came from JSON.

Django's template lookup tries a dict's key before its attribute, so `event.details.items` is the value of a
"items" key when the payload carries one (a review queue records `"items": 15`), not the dict's items(): the
page iterates a number and answers 500. A JSON field's keys are the data's, never ours to reserve, so every
template that walks one goes through this filter. Built into every template (settings.TEMPLATES builtins).
"""

from django import template

register = template.Library()


@register.filter
def entries(value) -> list[tuple]:
    """The dict's (key, value) pairs in its order; nothing for None (a JSON field left empty)."""
    return list(value.items()) if isinstance(value, dict) else []
