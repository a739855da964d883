"""The credentials an endpoint may send: named, chosen from a list, never an arbitrary environment variable.

An eval endpoint once named any environment variable for its key, and the workers sent that variable to the
endpoint's URL: an editor could have the studio's SECRET_KEY, DATABASE_URL or object-store keys posted to a server
of theirs. Now an endpoint's credential is one of:

- `operator:NAME`: the environment variable STUDIO_ENDPOINT_KEY_NAME, declared by the operator where the workers
  run (and where the web runs, to list it). Only variables with that prefix can be named; the list shows names.
- `project:NAME`: a key an owner stored for the project, encrypted at rest with settings.SECRETS_KEY (a Fernet
  key the database does not hold). Write-only: no page, API answer, export, audit row or log shows it again.

The value is read only where the work runs (`credential_value`), as the request is about to be made.
"""

from __future__ import annotations

import os
import re

from cryptography.fernet import Fernet, InvalidToken
from django.conf import settings
from django.db import transaction

from apps.common.errors import StudioError

from .models import Project, ProjectSecret
from .services import audit_record

OPERATOR_PREFIX = "STUDIO_ENDPOINT_KEY_"
NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9_-]{0,62}")


class CredentialRefused(StudioError, ValueError):
    """A credential an endpoint may not use, or one that is not there, in words saying what to do."""


def operator_credentials() -> list[str]:
    """The operator's credentials, by name: every STUDIO_ENDPOINT_KEY_<NAME> set in this process's environment."""
    return sorted(f"operator:{name[len(OPERATOR_PREFIX):]}" for name, value in os.environ.items()
                  if name.startswith(OPERATOR_PREFIX) and len(name) > len(OPERATOR_PREFIX) and value)


def credential_names(*, project: Project) -> list[str]:
    """What an endpoint of `project` may name as its credential: the operator's, then the project's own."""
    stored = ProjectSecret.objects.filter(project=project).order_by("name").values_list("name", flat=True)
    return operator_credentials() + [f"project:{name}" for name in stored]


def credential_check(*, project: Project, credential: str, field: str = "credential") -> None:
    """CredentialRefused (about `field`) unless `credential` is empty or one `credential_names` lists."""
    if not credential or credential in credential_names(project=project):
        return
    raise CredentialRefused(f"{credential!r} is not a credential of project {project.slug}; "
                            f"{choices_text(project=project)}", field=field)


def choices_text(*, project: Project) -> str:
    """The allowed credentials and how to add one, as a refusal ends."""
    names = credential_names(project=project)
    listed = f"choose one of {', '.join(names)}" if names else "none is declared yet"
    return (f"{listed} (the operator declares operator:NAME with the environment variable {OPERATOR_PREFIX}NAME; "
            f"an owner stores project:NAME on the evals page or with POST /api/v1/projects/{project.slug}/secrets)")


def _fernet() -> Fernet:
    if not settings.SECRETS_KEY:
        raise CredentialRefused("this studio stores no keys for projects: the operator has not set "
                                "STUDIO_SECRETS_KEY; use an operator credential (STUDIO_ENDPOINT_KEY_<NAME>)",
                                field="value")
    try:
        return Fernet(settings.SECRETS_KEY)
    except ValueError:
        raise CredentialRefused("STUDIO_SECRETS_KEY is not a Fernet key (base64 of 32 bytes)", status=500) from None


def project_secret_store(*, project: Project, name: str, value: str, actor, via: str = "web") -> ProjectSecret:
    """Store (or replace) the project's key `name`, encrypted; its audit row names it, never its value."""
    if not NAME.fullmatch(name or ""):
        raise CredentialRefused("a key's name is 1-63 letters, digits, '-' and '_'", field="name")
    if not value or len(value) > 10_000 or value != value.strip():
        raise CredentialRefused("the key: 1 to 10,000 characters, no leading or trailing spaces", field="value")
    ciphertext = _fernet().encrypt(value.encode()).decode()
    with transaction.atomic():
        secret, created = ProjectSecret.objects.update_or_create(
            project=project, name=name, defaults={"ciphertext": ciphertext, "created_by": actor if getattr(
                actor, "is_authenticated", False) else None})
        audit_record(project=project, actor=actor, action="secret.store" if created else "secret.replace",
                     target=f"secret/{name}", via=via)
    return secret


def credential_value(*, project: Project, credential: str) -> str:
    """The key `credential` names, read here and now (where the work runs); empty for no credential.
    CredentialRefused when it is not one an endpoint may use or is not set here."""
    if not credential:
        return ""
    kind, _, name = credential.partition(":")
    if kind == "operator" and NAME.fullmatch(name):
        value = os.environ.get(OPERATOR_PREFIX + name, "")
        if not value:
            raise CredentialRefused(f"the credential {credential} is not set where this worker runs: the operator "
                                    f"sets {OPERATOR_PREFIX}{name} in the workers' environment", field="credential")
        return value
    if kind == "project":
        secret = ProjectSecret.objects.filter(project=project, name=name).first()
        if secret is None:
            raise CredentialRefused(f"project {project.slug} has no stored key {name!r} (removed?); "
                                    f"{choices_text(project=project)}", field="credential")
        try:
            return _fernet().decrypt(secret.ciphertext.encode()).decode()
        except InvalidToken:
            raise CredentialRefused(f"the stored key {name!r} cannot be decrypted with this STUDIO_SECRETS_KEY "
                                    "(changed since?): an owner stores it again", field="credential") from None
    raise CredentialRefused(f"{credential!r} is not a credential an endpoint may use; "
                            f"{choices_text(project=project)}", field="credential")
