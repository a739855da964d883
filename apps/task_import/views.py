"""The task upload pages: a file of tasks (JSONL, JSONL.gz, CSV, Parquet) uploaded in the browser into a task
template, previewed, and published as its next version only when confirmed, through the registry's
`version_publish` as any author publishes. They sit under the template's registry path (`.../upload/`), which its
pages link to.

1. `task_upload`: the file and its format. The file is streamed to the data directory as it arrives
   (`_ToDataDir`, a Django upload handler), never held whole in memory.
2. `task_upload_preview`: the file's columns, the column mapping (format `columns`), every bad row by its line,
   and the first rows rendered through the template's prompt as the engine renders it. A large file is read
   in the background (upload_jobs.py) while the page shows its progress (`task_upload_progress`, polled).
   Nothing is published.
3. `task_upload_publish`: "Publish @N+1 with these K tasks": the rows read become the task set of the next
   version, against the head the preview was made with. The preview says what that does to the head's tasks
   (kept, changed, removed, new). A file with bad rows is refused unless the uploader ticks "the good rows only";
   then the version's message (and so its audit row) names the rows left out.

Editors only, as every registry page that writes; an upload is its uploader's.
"""

import re
from urllib.parse import parse_qsl, urlencode

from django.contrib import messages
from django.core.files.uploadedfile import UploadedFile
from django.core.files.uploadhandler import FileUploadHandler, SkipFile, StopFutureHandlers, StopUpload
from django.http import Http404, HttpResponse
from django.shortcuts import redirect, render
from django.template.defaultfilters import pluralize
from django.urls import reverse
from django.views.decorators.csrf import csrf_exempt, csrf_protect
from django.views.decorators.http import require_POST

from apps.accounts.models import Role
from apps.accounts.selectors import project_for_page
from apps.registry import selectors
from apps.registry.errors import PublishConflict, SpecError, VersionNotFound
from apps.registry.pins import pinned_template
from apps.registry.refs import Ref, split_slug_ref
from apps.registry.services import version_publish

from .forms import ColumnMappingForm, FormatForm, TaskUploadForm, UploadPublishForm
from .swe_bench import SWE_BENCH, UPLOAD_INPUTS
from .task_files import COLUMNS, FILE_TYPES, FORMAT_INPUTS, FORMATS, columns_of
from .upload_jobs import (
    Upload,
    background_bytes,
    guess_mapping,
    job_ensure,
    job_instances,
    job_replacement,
    job_stalled,
    job_state,
    max_bytes,
    placeholders_in_order,
)


def _template(project, kind, slug):
    """The task template and its head version; 404 for any other kind or an unknown slug."""
    if kind != "task_template":
        raise Http404("Only task templates hold tasks.")
    try:
        definition = selectors.definition_get(project=project, kind=kind, slug=slug)
    except VersionNotFound as exc:
        raise Http404(str(exc)) from None
    head = selectors.version_head(definition=definition)
    if head is None:
        raise Http404(f"{definition} has no version yet.")
    return definition, head


def _upload(request, project, definition, upload_id) -> Upload:
    upload = Upload.find(upload_id)
    if upload is None or not upload.belongs_to(project=project.slug, kind=definition.kind, slug=definition.slug,
                                               user_id=request.user.pk):
        raise Http404("No such upload: it was published, removed after two days, or is someone else's.")
    return upload


def _url(name, project, definition, upload=None, query: str = "") -> str:
    kwargs = {"project": project.slug, "kind": definition.kind, "slug": definition.slug}
    if upload is not None:
        kwargs["upload"] = upload.id
    return reverse(f"task_import:{name}", kwargs=kwargs) + (f"?{query}" if query else "")


# --- 1. the file -------------------------------------------------------------------------------------------------

class _ToDataDir(FileUploadHandler):
    """Writes the `file` field's chunks straight into the upload's directory as they arrive (Django's default
    handlers hold small files in memory and copy large ones through a temporary file); stops past max_bytes."""

    def __init__(self, upload: Upload, limit: int, request=None):
        super().__init__(request)
        self.upload, self.limit = upload, limit
        self.handle, self.stored, self.size, self.too_large = None, None, 0, False

    def new_file(self, field_name, file_name, *args, **kwargs):
        super().new_file(field_name, file_name, *args, **kwargs)
        if field_name != "file" or self.handle is not None or self.stored is not None:
            raise SkipFile()
        self.stored = self.upload.stored_name(file_name)
        self.handle = open(self.upload.directory / self.stored, "wb")  # closed in file_complete
        raise StopFutureHandlers()

    def receive_data_chunk(self, raw_data, start):
        self.size += len(raw_data)
        if self.size > self.limit:
            self.too_large = True
            self._discard()
            raise StopUpload(connection_reset=False)
        self.handle.write(raw_data)
        return None

    def file_complete(self, file_size):
        if self.handle is None:
            return None
        self.handle.close()
        self.handle = None
        return UploadedFile(file=None, name=self.file_name, content_type=self.content_type, size=file_size)

    def upload_interrupted(self):
        self._discard()

    def _discard(self):
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        if self.stored:
            (self.upload.directory / self.stored).unlink(missing_ok=True)
            self.stored = None


@csrf_exempt  # the CSRF check runs in _receive, once the upload handler is in place (Django's documented way)
def task_upload(request, project, kind, slug):
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition, head = _template(project, kind, slug)
    context = {"project": project, "can_edit": can_edit, "definition": definition, "head": head,
               "formats": FORMATS, "file_types": FILE_TYPES.values(), "max_bytes": max_bytes(),
               "background_bytes": background_bytes(),
               "placeholders": placeholders_in_order(head.spec["prompt_template"])}
    if request.method != "POST":
        context["form"] = TaskUploadForm()
        return render(request, "task_import/task_upload.html", context)
    upload = Upload.new()
    handler = _ToDataDir(upload, max_bytes(), request)
    request.upload_handlers = [handler]
    try:
        response = _receive(request, project=project, definition=definition, upload=upload, handler=handler,
                            context=context)
    finally:
        if not upload.meta:  # refused (CSRF, no file, too large): nothing is kept
            upload.remove()
    return response


@csrf_protect
def _receive(request, *, project, definition, upload, handler, context):
    form = context["form"] = TaskUploadForm(request.POST)
    problems = []
    if handler.too_large:
        problems.append(f"The file is larger than {max_bytes() // 2**20} MB, the most an upload may be.")
    elif not handler.stored or "file" not in request.FILES:
        problems.append("Choose a file to upload.")
    elif handler.size == 0:
        problems.append("The file is empty.")
    if problems or not form.is_valid():
        context["problems"] = problems
        return render(request, "task_import/task_upload.html", context, status=400)
    fmt = form.cleaned_data["format"]
    upload.describe(project=project.slug, kind=definition.kind, slug=definition.slug, user_id=request.user.pk,
                    name=request.FILES["file"].name, stored=handler.stored, size=handler.size, fmt=fmt)
    return redirect(_url("task_upload_preview", project, definition, upload, urlencode({"format": fmt})))


# --- 2. the preview ----------------------------------------------------------------------------------------------

def task_upload_preview(request, project, kind, slug, upload):
    project, can_edit = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition, head = _template(project, kind, slug)
    upload = _upload(request, project, definition, upload)
    meta = upload.meta
    chosen = FormatForm(request.GET if "format" in request.GET else None, initial={"format": meta["format"]})
    fmt = chosen.cleaned_data["format"] if chosen.is_bound and chosen.is_valid() else meta["format"]
    placeholders = placeholders_in_order(head.spec["prompt_template"])
    columns = columns_of(upload.source, meta["name"])
    context = {"project": project, "can_edit": can_edit, "definition": definition, "head": head, "upload": upload,
               "meta": meta, "format": fmt, "format_form": FormatForm(initial={"format": fmt}), "columns": columns,
               "placeholders": placeholders, "query": request.GET.urlencode()}
    mapping = None
    if fmt == COLUMNS:
        if request.GET.get("map"):
            form = ColumnMappingForm(request.GET, columns=columns, placeholders=placeholders)
            mapping = form.mapping() if form.is_valid() else None
        else:
            mapping = guess_mapping(columns, placeholders)
            form = ColumnMappingForm(columns=columns, placeholders=placeholders, mapping=mapping)
        context["mapping_form"] = form
        if not columns:
            context["file_problem"] = ("No columns could be read from this file: is it JSONL (one JSON object a "
                                       "line), CSV with a header line, or Parquet?")
        if mapping is None:
            return render(request, "task_import/task_upload_preview.html", context)
    else:
        given_inputs = UPLOAD_INPUTS if fmt == SWE_BENCH else FORMAT_INPUTS[fmt]
        missing = [name for name in placeholders if name not in given_inputs]
        if missing:
            given = ", ".join("{" + n + "}" for n in sorted(given_inputs))
            context["file_problem"] = (
                f"The prompt template uses {', '.join('{' + n + '}' for n in missing)}, which the {fmt} format does "
                f"not give (it gives {given}): choose the columns format to say which column each input is.")
            return render(request, "task_import/task_upload_preview.html", context)
    key, state = job_ensure(upload, fmt=fmt, mapping=mapping, head=head.number, spec=head.spec,
                            verifier=_verifier_of(project, head),
                            image=pinned_template(project=project, text=f"{definition.slug}@{head.number}")
                            .image.to_json() if fmt == SWE_BENCH else None)
    context.update(job=key, state=state)
    if state["state"] == "done" and ((state["count"] and not state["errors"]) or state.get("skippable")):
        context["replacement"] = job_replacement(upload, key,
                                                 head_hashes=selectors.instance_hashes(version=head))
        context["publish_form"] = UploadPublishForm(initial={
            "job": key, "expected_head": head.number,
            "message": f"Upload {state['good_rows']} tasks from {meta['name']}"})
    return render(request, "task_import/task_upload_preview.html", context)


def task_upload_progress(request, project, kind, slug, upload):
    """The progress bar the preview page polls while a large file is read; once the job is no longer running,
    the page reloads itself (htmx's HX-Refresh) to show what was found."""
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition, _ = _template(project, kind, slug)
    upload = _upload(request, project, definition, upload)
    job = request.GET.get("job", "")
    state = job_state(upload, job)
    if state is None:
        raise Http404("No such job.")
    if state["state"] != "running" or job_stalled(upload, job, state):
        response = HttpResponse(status=200)
        response["HX-Refresh"] = "true"
        return response
    return render(request, "task_import/_task_upload_progress.html",
                  {"project": project, "definition": definition, "upload": upload, "job": job, "state": state})


# --- 3. publishing -----------------------------------------------------------------------------------------------

@require_POST
def task_upload_publish(request, project, kind, slug, upload):
    project, _ = project_for_page(user=request.user, slug=project, min_role=Role.EDITOR)
    definition, _ = _template(project, kind, slug)
    upload = _upload(request, project, definition, upload)
    # Back to the preview as it was (its format and mapping), should publishing be refused.
    back = _url("task_upload_preview", project, definition, upload,
                urlencode(parse_qsl(request.POST.get("query", ""))))
    form = UploadPublishForm(request.POST)
    if not form.is_valid():
        messages.error(request, "Publishing needs a message; nothing was published.")
        return redirect(back)
    job = form.cleaned_data["job"]
    state = job_state(upload, job)
    if not state or state["state"] != "done" or not (state["count"] or state.get("skippable")):
        messages.error(request, "This preview has no tasks to publish; nothing was published.")
        return redirect(back)
    message = form.cleaned_data["message"]
    if state["errors"]:
        if not form.cleaned_data["skip_bad_rows"]:
            messages.error(request, f"The file has {state['bad_rows']} bad row{pluralize(state['bad_rows'])}; "
                                    "nothing was published. Fix them and upload the file again, or tick “Publish "
                                    "the good rows only”.")
            return redirect(back)
        message = f"{message} ({_rows_left_out(state)})"
    instances = job_instances(upload, job)
    head = selectors.version_head(definition=definition)
    try:
        published = version_publish(project=project, kind=kind, slug=slug, spec=head.spec, author=request.user,
                                    message=message, instances=instances,
                                    expected_head=form.cleaned_data["expected_head"], via="web")
    except PublishConflict as exc:
        messages.error(request, f"{exc} The preview below is against the newest version now.")
        return redirect(back)
    except SpecError as exc:
        for error in exc.errors[:20]:
            messages.error(request, f"Not published: {_by_key(error, instances)}")
        return redirect(back)
    upload.remove()
    version = published.version
    if published.created:
        left_out = f"; {_rows_left_out(state)}" if state["errors"] else ""
        messages.success(request, f"Published {version.ref} with {len(instances)} tasks{left_out}.")
    else:
        messages.info(request, f"{version.ref} already holds these tasks; nothing was published.")
    return redirect("registry:version_detail", project=project.slug, kind=kind, slug=slug, number=version.number)


def _rows_left_out(state: dict, listed: int = 10) -> str:
    """`2 bad rows left out: line 3, line 9` — what a publish of the good rows only says it skipped."""
    places = [field for field, _ in state["errors"] if field][:listed]
    more = state["bad_rows"] - len(places)
    return (f"{state['bad_rows']} bad row{pluralize(state['bad_rows'])} left out: {', '.join(places)}"
            + (f" and {more} more" if more > 0 else ""))


def _by_key(error, instances) -> str:
    """`instances[12].inputs: ...` from publishing, said as the task's key, which the user can find."""
    match = re.match(r"instances\[(\d+)\](.*)", error.field)
    if match and int(match[1]) < len(instances):
        return f"task {instances[int(match[1])]['key']!r}{match[2]}: {error.problem}"
    return str(error)


def _verifier_of(project, template) -> tuple[str, dict] | None:
    """(ref, spec) of the verifier version a template version names, whose references the rows must fill."""
    try:
        version = selectors.version_resolve(project=project, ref=Ref("verifier",
                                                                     *split_slug_ref(template.spec["verifier"])))
    except VersionNotFound:
        return None
    return version.ref, version.spec
