"""The forms of the task upload pages (views.py): the file and its format, the column mapping, publishing."""

from django import forms

from .task_files import AS_READ, COLUMNS, CONVERSIONS, ColumnMapping

FORMAT_CHOICES = [
    ("exact-answer", "exact-answer — key, prompt, answer"),
    ("code-benchmark", "code-benchmark — task_id, prompt, canonical_solution, test, entry_point (HumanEval)"),
    ("gsm8k", "gsm8k — question, answer ending in #### <number> (GSM8K)"),
    ("multiple-choice", "multiple-choice — question, choices, answer index or letter (MMLU)"),
    ("swe-bench", "swe-bench — a .tar.gz of instances.jsonl (SWE-bench) and repos/<instance_id>; each validated "
                  "in the sandbox"),
    (COLUMNS, "columns — any other shape: choose the key, input and hidden columns next"),
]


class TaskUploadForm(forms.Form):
    """The format; the file itself is written to disk by the page's upload handler as it arrives."""

    format = forms.ChoiceField(choices=FORMAT_CHOICES, initial="exact-answer")


class FormatForm(forms.Form):
    """?format= on the preview page: the same file read in another format."""

    format = forms.ChoiceField(choices=FORMAT_CHOICES)


class ColumnMappingForm(forms.Form):
    """Which column is the key, which column each of the prompt template's inputs comes from, which columns are
    kept hidden (references, tests: what the verifier reads), and how each column's value is read."""

    map = forms.CharField(widget=forms.HiddenInput, initial="1")  # says the mapping was sent, not guessed
    format = forms.CharField(widget=forms.HiddenInput, initial=COLUMNS)

    def __init__(self, data=None, *, columns: list[str], placeholders: list[str],
                 mapping: ColumnMapping | None = None):
        super().__init__(data)
        self.columns, self.placeholders = columns, placeholders
        choices = [("", "—")] + [(c, c) for c in columns]
        self.fields["key"] = forms.ChoiceField(choices=choices, label="Key column",
                                               help_text="one value per task, unique in the file")
        for name in placeholders:
            self.fields[f"input-{name}"] = forms.ChoiceField(choices=choices, label=f"{{{name}}}",
                                                             initial=mapping.inputs.get(name) if mapping else None)
        self.fields["hidden"] = forms.MultipleChoiceField(
            choices=[(c, c) for c in columns], required=False, widget=forms.CheckboxSelectMultiple,
            label="Hidden columns", help_text="kept with each task under the column's name, never shown to the "
                                              "model: answers, tests")
        for index, column in enumerate(columns):
            self.fields[f"as-{index}"] = forms.ChoiceField(choices=list(CONVERSIONS.items()), required=False,
                                                           label=f"Read {column} as", initial=AS_READ)
        if mapping:
            self.initial.update(key=mapping.key, hidden=list(mapping.hidden),
                                **{f"as-{i}": mapping.convert.get(c, AS_READ) for i, c in enumerate(columns)})

    def input_fields(self):
        return [self[f"input-{name}"] for name in self.placeholders]

    def column_rows(self):
        """(column, its read-as field) for the table of columns."""
        return [(column, self[f"as-{index}"]) for index, column in enumerate(self.columns)]

    def mapping(self) -> ColumnMapping:
        data = self.cleaned_data
        convert = {column: data.get(f"as-{index}") or AS_READ for index, column in enumerate(self.columns)}
        return ColumnMapping(key=data["key"], inputs={name: data[f"input-{name}"] for name in self.placeholders},
                             hidden=tuple(c for c in self.columns if c in data["hidden"]),
                             convert={c: how for c, how in convert.items() if how != AS_READ})


class UploadPublishForm(forms.Form):
    job = forms.RegexField(regex=r"^[0-9a-f]{20}$", widget=forms.HiddenInput)
    # The head the preview was made against: publishing is refused if someone published after it.
    expected_head = forms.IntegerField(min_value=0, widget=forms.HiddenInput)
    message = forms.CharField(max_length=500, help_text="What changed and why; shown in the version history.")
    # Off unless ticked: a file with bad rows is refused as a whole, as before, unless the uploader chooses this.
    skip_bad_rows = forms.BooleanField(required=False, label="Publish the good rows only, leaving the bad rows out")
