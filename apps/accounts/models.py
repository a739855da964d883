"""Teams, projects, roles, API tokens and the audit log. Everything else in the studio is scoped to a Project."""

from django.conf import settings
from django.core.validators import RegexValidator
from django.db import models

from workers.definitions.specs import SLUG_RE

SLUG_PATTERN = f"^{SLUG_RE}$"  # a project's slug is spelled as a definition's (the API's hints read SLUG_RE)
slug_validator = RegexValidator(
    SLUG_PATTERN,
    "Use 1-63 lowercase letters, digits and hyphens, starting with a letter or digit (no '/', '.', spaces).",
)


class Role(models.TextChoices):
    # Ordered from least to most privileged; `Role.rank` compares them.
    VIEWER = "viewer"
    REVIEWER = "reviewer"
    EDITOR = "editor"
    OWNER = "owner"

    @classmethod
    def rank(cls, role: str) -> int:
        return [cls.VIEWER, cls.REVIEWER, cls.EDITOR, cls.OWNER].index(role)


class Team(models.Model):
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.name


class Project(models.Model):
    team = models.ForeignKey(Team, on_delete=models.PROTECT, related_name="projects")
    slug = models.CharField(max_length=63, unique=True, validators=[slug_validator])
    name = models.CharField(max_length=200)
    created_at = models.DateTimeField(auto_now_add=True)

    def __str__(self) -> str:
        return self.slug


class Membership(models.Model):
    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="memberships")
    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="memberships")
    role = models.CharField(max_length=16, choices=Role.choices)
    # "" for a role an owner granted by hand; else the sign-on provider id whose group mapping granted it
    # (apps/sso): a login recomputes only those, and never touches a hand-granted role.
    granted_by = models.CharField(max_length=63, blank=True, default="")

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "user"], name="one_role_per_project")]


class TokenScope(models.TextChoices):
    """What a token may do in its project, at most: its holder's role there caps it too."""

    READ = "read", "read (a viewer's rights)"
    REVIEW = "review", "review (a reviewer's rights)"
    WRITE = "write", "write (an editor's rights)"
    ADMIN = "admin", "admin (an owner's rights: the audit log)"
    # For a trainer elsewhere: it plays the project's environments through `manage.py environments serve`, which
    # records its episodes as runs (an editor's or an owner's token). Handed to a training cluster, it reads the
    # rest of the API as a viewer does, and writes nothing there.
    ENVIRONMENT = "environment", "environment (play the environments served over OpenEnv; a viewer's rights here)"
    # For the company's identity provider: SCIM 2.0 provisioning at /scim/v2 (apps/sso/scim.py), and nothing else.
    # A SCIM token belongs to no project (it creates and deactivates people studio-wide), is made by an operator
    # (`manage.py scim_token`), and the REST API refuses it (apps/accounts/api_auth.py).
    SCIM = "scim", "scim (provision people from the identity provider at /scim/v2; nothing else)"

    @classmethod
    def ceiling(cls, scope: str) -> str:
        # A SCIM token has no rights in any project (the REST API refuses it before asking).
        return {cls.READ: Role.VIEWER, cls.REVIEW: Role.REVIEWER, cls.WRITE: Role.EDITOR, cls.ADMIN: Role.OWNER,
                cls.ENVIRONMENT: Role.VIEWER, cls.SCIM: Role.VIEWER}[scope]


class ApiToken(models.Model):
    """A bearer token `pts_<prefix>_<secret>` for one project, with a scope and maybe an expiry; only its SHA-256
    digest is stored, the plaintext is shown once. Tokens made before scopes existed (no project) were revoked
    by migration accounts/0002."""

    user = models.ForeignKey(settings.AUTH_USER_MODEL, on_delete=models.CASCADE, related_name="api_tokens")
    project = models.ForeignKey(Project, null=True, on_delete=models.CASCADE, related_name="api_tokens")
    scope = models.CharField(max_length=16, choices=TokenScope.choices, default=TokenScope.READ)
    name = models.CharField(max_length=100)
    prefix = models.CharField(max_length=12, unique=True)
    digest = models.CharField(max_length=64, unique=True)
    created_at = models.DateTimeField(auto_now_add=True)
    expires_at = models.DateTimeField(null=True, blank=True)
    last_used_at = models.DateTimeField(null=True, blank=True)
    revoked_at = models.DateTimeField(null=True, blank=True)
    # A SCIM token's identity provider (its id in settings.SIGN_ON_PROVIDERS): the people it provisions are that
    # provider's, and only a login through it is linked to them (apps/sso). Empty for every other scope.
    provider = models.CharField(max_length=63, blank=True, default="")

    @property
    def ceiling(self) -> str:
        return TokenScope.ceiling(self.scope)


class AuditEvent(models.Model):
    """One row for every write, in the same transaction as the write."""

    project = models.ForeignKey(Project, null=True, on_delete=models.CASCADE, related_name="audit_events")
    actor = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    action = models.CharField(max_length=64)  # a verb: "version.publish", "alias.move", ...
    target = models.CharField(max_length=255)  # what it acted on: "verifier/code-tests@3"
    details = models.JSONField(default=dict)
    via = models.CharField(max_length=16, default="web")  # web | api | cli
    created_at = models.DateTimeField(auto_now_add=True, db_index=True)

    class Meta:
        indexes = [models.Index(fields=["project", "-created_at"])]


class ProjectSecret(models.Model):
    """An API key an owner stored for the project's endpoints (apps/accounts/credentials.py): only its Fernet
    token is kept, encrypted with settings.SECRETS_KEY, which is not in the database. Never shown again."""

    project = models.ForeignKey(Project, on_delete=models.CASCADE, related_name="secrets")
    name = models.CharField(max_length=63, validators=[slug_validator])
    ciphertext = models.TextField()
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, on_delete=models.SET_NULL, related_name="+")
    created_at = models.DateTimeField(auto_now=True)

    class Meta:
        constraints = [models.UniqueConstraint(fields=["project", "name"], name="project_secret_name_unique")]

    def __str__(self) -> str:
        return f"project:{self.name}"  # the name only: a secret's value never goes into a string
