"""`manage.py scim_token create --provider ID --user NAME [--name NAME] [--expires-days N]`, `scim_token list`,
`scim_token revoke PREFIX`: the bearer token the identity provider's SCIM client sends to /scim/v2 (apps/sso/scim.py).
A token belongs to one identity provider (ID: one of STUDIO_OIDC_PROVIDERS or STUDIO_SAML_PROVIDERS): the people it
creates are that provider's, and their logins through it are linked to them. An operator's command: the token
creates and deactivates people, so it is held by a staff account, made on the machine that runs the studio, and
audited (token.create / token.revoke, via "cli")."""

from __future__ import annotations

from datetime import timedelta

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError
from django.utils import timezone

from apps.accounts.models import ApiToken, TokenScope
from apps.accounts.services import api_token_revoke, scim_token_create


class Command(BaseCommand):
    help = "Create, list or revoke the SCIM tokens the identity provider provisions people with (/scim/v2)."

    def add_arguments(self, parser):
        actions = parser.add_subparsers(dest="action", required=True)
        create = actions.add_parser("create", help="print a new SCIM token (shown once)")
        create.add_argument("--provider", required=True,
                            help="the identity provider whose people it provisions (its id in STUDIO_OIDC_PROVIDERS "
                                 "or STUDIO_SAML_PROVIDERS)")
        create.add_argument("--user", required=True, help="the staff account that holds it (audit rows name it)")
        create.add_argument("--name", default="identity provider", help="where it is used, e.g. okta")
        create.add_argument("--expires-days", type=int, default=None, help="days until it expires (default never)")
        actions.add_parser("list", help="the SCIM tokens, live and revoked")
        revoke = actions.add_parser("revoke", help="revoke a SCIM token by its prefix (pts_PREFIX_...)")
        revoke.add_argument("prefix")

    def handle(self, *args, action, **options):
        return getattr(self, f"_{action}")(**options)

    def _create(self, *, provider, user, name, expires_days, **_):
        holder = get_user_model().objects.filter(username=user).first()
        if holder is None:
            raise CommandError(f"No user {user!r}: name a staff account (createsuperuser makes one).")
        expires_at = timezone.now() + timedelta(days=expires_days) if expires_days else None
        try:
            _, plaintext = scim_token_create(user=holder, provider=provider, name=name, expires_at=expires_at,
                                             via="cli")
        except ValueError as exc:
            raise CommandError(str(exc)) from exc
        self.stderr.write("The SCIM token (shown once; give it to the identity provider's SCIM app as its bearer "
                          "token, with the base URL https://<this studio>/scim/v2):")
        self.stdout.write(plaintext)

    def _list(self, **_):
        for token in ApiToken.objects.filter(scope=TokenScope.SCIM).select_related("user").order_by("-created_at"):
            state = f"revoked {token.revoked_at:%Y-%m-%d}" if token.revoked_at else "live"
            self.stdout.write(f"pts_{token.prefix}_…  {token.name}  for {token.provider or '(no provider)'}  "
                              f"held by {token.user.username}  {state}")

    def _revoke(self, *, prefix, **_):
        token = ApiToken.objects.filter(scope=TokenScope.SCIM, prefix=prefix.removeprefix("pts_").split("_")[0]).first()
        if token is None:
            raise CommandError(f"No SCIM token {prefix!r}; `manage.py scim_token list` shows them.")
        if token.revoked_at is None:
            api_token_revoke(token=token, actor=token.user, via="cli")
        self.stdout.write(f"Revoked pts_{token.prefix}_… ({token.name}).")
