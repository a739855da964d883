"""The queue form: what a browser sends to draw a queue. It checks the shape of each field; `queue_create`
checks the rest (rubric, roles, filters, what the rule draws) and its errors are shown at the field they name."""

from django import forms
from django.contrib.auth import get_user_model

from apps.accounts.models import Membership, Role
from apps.common.forms import MultilineField
from apps.registry.models import Version
from apps.trajectories.selectors import FILTERS

from .services import SAMPLING_RULES

RULE_HELP = {
    "random": "random: N drawn at random",
    "stratified": "stratified: an equal share of N per domain",
    "judged": "judged: graded by a judge (spot checks)",
    "judge_doubtful": "judge doubtful: passed, the judge unsure (0.2 to 0.8)",
    "disagree": "disagree: the verifier's checks and its judge disagree",
    "hack_shaped": "hack-shaped: passed with an answer in the shortest quarter",
}


class QueueCreateForm(forms.Form):
    slug = forms.SlugField(max_length=63, help_text="Lowercase letters, digits and hyphens, e.g. judge-spot-check.")
    description = MultilineField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    rubric = forms.ModelChoiceField(queryset=Version.objects.none(), help_text="The questions reviewers answer.")
    # The trajectory browser's filters, under its own names, so that its query string fills them in.
    run = forms.ChoiceField(required=False)
    domain = forms.CharField(required=False, max_length=63)
    category = forms.CharField(required=False, max_length=63, help_text="the domains of a category, e.g. algebra")
    template = forms.CharField(required=False, max_length=140, help_text="task_template/SLUG, any version")
    verifier = forms.CharField(required=False, max_length=140, help_text="verifier/SLUG, any version")
    verdict_status = forms.ChoiceField(required=False, choices=[("", "any"), *[(s, s) for s in
                                                                               ("pass", "partial", "fail")]])
    deciding_layer = forms.CharField(required=False, max_length=64)
    policy_version = forms.IntegerField(required=False, min_value=0)
    reward_min = forms.FloatField(required=False)
    reward_max = forms.FloatField(required=False)
    rule = forms.ChoiceField(choices=[(rule, RULE_HELP[rule]) for rule in SAMPLING_RULES if rule != "list"])
    n = forms.IntegerField(min_value=1, max_value=10_000, initial=50, label="N")
    seed = forms.IntegerField(min_value=0, initial=0, required=False)
    overlap = forms.IntegerField(min_value=1, max_value=10, initial=2, help_text="Reviewers per item.")
    blind = forms.BooleanField(required=False, initial=True,
                               help_text="A reviewer never sees others' labels before submitting.")
    reviewers = forms.ModelMultipleChoiceField(queryset=get_user_model().objects.none(),
                                               widget=forms.CheckboxSelectMultiple)
    adjudicators = forms.ModelMultipleChoiceField(queryset=get_user_model().objects.none(), required=False,
                                                  widget=forms.CheckboxSelectMultiple,
                                                  help_text="Besides owners, who settles disagreements.")
    reservation_minutes = forms.IntegerField(min_value=1, max_value=1440, initial=15,
                                             help_text="How long an item stays with a reviewer who opened it.")
    follow_share = forms.FloatField(min_value=0, max_value=1, initial=0, required=False,
                                    help_text="Keep drawing: this share of what the filters and rule select among "
                                              "the trajectories runs archive from now on joins the queue.")

    def __init__(self, *args, project, runs, **kwargs):
        super().__init__(*args, **kwargs)
        self.fields["rubric"].queryset = (Version.objects.filter(definition__project=project, definition__kind="rubric")
                                          .select_related("definition").order_by("definition__slug", "-number"))
        self.fields["rubric"].label_from_instance = lambda version: version.ref
        self.fields["run"].choices = [("", "any run"), *[(str(run.pk), run.name) for run in runs]]
        members = Membership.objects.filter(project=project).select_related("user").order_by("user__username")
        users = get_user_model().objects.filter(memberships__project=project).order_by("username")
        for name, least in (("reviewers", Role.REVIEWER), ("adjudicators", Role.EDITOR)):
            allowed = [m.user_id for m in members if Role.rank(m.role) >= Role.rank(least)]
            self.fields[name].queryset = users.filter(pk__in=allowed)
            self.fields[name].label_from_instance = lambda user: user.username

    GROUPS = (("Queue", ("slug", "description", "rubric")),
              ("Trajectories (the browser's filters)", ("run", "domain", "category", "template", "verifier",
                                                         "verdict_status", "deciding_layer", "policy_version",
                                                         "reward_min", "reward_max")),
              ("Sampling", ("rule", "n", "seed", "follow_share")),
              ("People", ("overlap", "blind", "reviewers", "adjudicators", "reservation_minutes")))

    def groups(self):
        """(legend, bound fields) per fieldset of the page."""
        return [(legend, [self[name] for name in names]) for legend, names in self.GROUPS]

    def filters(self) -> dict:
        return {name: self.cleaned_data[name] for name in FILTERS
                if name in self.cleaned_data and self.cleaned_data[name] not in (None, "")}

    def sampling(self) -> dict:
        return {"rule": self.cleaned_data["rule"], "n": self.cleaned_data["n"], "seed": self.cleaned_data["seed"] or 0}
