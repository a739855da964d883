"""The registry's web forms. They check what a browser sends; the services check the spec itself."""

from django import forms

from apps.common.forms import MultilineField

from .files import YamlError, load_yaml
from .models import Kind


class SpecYamlField(MultilineField):
    """A spec written as YAML; cleans to the parsed mapping, while the page keeps showing the text as typed."""

    widget = forms.Textarea(attrs={"rows": 24, "spellcheck": "false", "class": "code"})

    def __init__(self, **kwargs):
        super().__init__(strip=False, **kwargs)

    def to_python(self, value):
        text = super().to_python(value)
        if text in self.empty_values:
            return text  # left to `required`, which says so plainly
        try:
            spec = load_yaml(text)
        except YamlError as exc:
            raise forms.ValidationError(f"{exc}.") from None
        if not isinstance(spec, dict):
            raise forms.ValidationError("The spec must be a YAML mapping of fields (field: value, one per line).")
        return spec


class VersionEditForm(forms.Form):
    spec = SpecYamlField()
    message = forms.CharField(max_length=500, help_text="What changed and why; shown in the version history.")
    # The version the edit started from: publishing is refused if someone published after it.
    expected_head = forms.IntegerField(min_value=0, widget=forms.HiddenInput)


class DefinitionCreateForm(forms.Form):
    kind = forms.ChoiceField(choices=Kind.choices)
    slug = forms.CharField(max_length=63, help_text="Lowercase letters, digits and hyphens, e.g. add-two.")
    description = MultilineField(required=False, widget=forms.Textarea(attrs={"rows": 2}))
    spec = SpecYamlField()
    message = forms.CharField(max_length=500, initial="First version")


class AliasMoveForm(forms.Form):
    name = forms.CharField(max_length=63, help_text="e.g. prod; moving an alias is audited.")
    number = forms.IntegerField(min_value=1, label="Version")


class VersionPairForm(forms.Form):
    """?a=N&b=M on the diff page."""

    a = forms.IntegerField(min_value=1)
    b = forms.IntegerField(min_value=1)
