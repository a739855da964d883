"""Specs and task data as text on the pages, written the same way the exported files write them."""

import json

from django import template

from apps.registry.files import dump_yaml

register = template.Library()


@register.filter(name="as_yaml")
def as_yaml(value) -> str:
    return dump_yaml(value)


@register.filter(name="as_json")
def as_json(value) -> str:
    # Compact but readable: one instance's inputs fit on one table row.
    return json.dumps(value, ensure_ascii=False, sort_keys=True, separators=(", ", ": "))
