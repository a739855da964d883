"""{% run_hacks run %}: the confirmed reward hacks of a run, for the run's page (which knows nothing of review)."""

from django import template

from apps.review.selectors import confirmed_hacks

register = template.Library()


@register.inclusion_tag("review/_run_hacks.html", takes_context=True)
def run_hacks(context, run):
    hacks = confirmed_hacks(run=run)
    verifiers = sorted({t.verifier.split("/", 1)[1].split("@")[0] for t in hacks})
    return {"project": context["project"], "run": run, "hacks": hacks, "verifiers": verifiers}
